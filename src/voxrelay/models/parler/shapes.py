"""The sizes of a Parler-TTS model without its codec: upstream's ``ParlerTTSDecoderConfig`` fields the model
uses and the whole ``ParlerTTSConfig`` (:func:`.keymap.config_from_upstream` reads upstream's config.json)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import T5Config


@dataclass(frozen=True)
class ParlerDecoderConfig:
    """The fields of upstream's ``ParlerTTSDecoderConfig`` the model uses (defaults: mini-v1's decoder)."""

    vocab_size: int = 1088  # codebook_size + 64: ids >= codebook_size are special (EOS/PAD 1024, BOS 1025)
    num_codebooks: int = 9
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    num_cross_attention_key_value_heads: int = 16
    ffn_dim: int = 4096
    max_position_embeddings: int = 4096  # prompt + audio positions (30 s at 86 Hz = 2580 frames)
    activation_function: str = "gelu"
    dropout: float = 0.1  # on embeddings and on each residual branch
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    rope_embeddings: bool = False  # False: sinusoids added to the inputs (all released checkpoints)
    rope_theta: float = 10_000.0
    use_fused_lm_heads: bool = False  # only the checkpoint layout; the module always has K heads
    codebook_weights: tuple[float, ...] | None = None  # loss weights per codebook (None: plain mean)
    eos_token_id: int = 1024  # also PAD
    bos_token_id: int = 1025  # also the decoder start id
    initializer_factor: float = 0.02  # std of the random init of Linear/Embedding weights

    def __post_init__(self) -> None:
        heads = self.num_attention_heads
        if self.hidden_size % heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {heads}")
        for name in ("num_key_value_heads", "num_cross_attention_key_value_heads"):
            if heads % getattr(self, name):
                raise ValueError(f"{name}={getattr(self, name)} must divide num_attention_heads={heads}")
        if self.codebook_weights is not None and len(self.codebook_weights) != self.num_codebooks:
            raise ValueError(
                f"codebook_weights has {len(self.codebook_weights)} entries; give one per codebook "
                f"({self.num_codebooks}) or None"
            )
        if max(self.eos_token_id, self.bos_token_id) >= self.vocab_size:
            raise ValueError(f"eos/bos ids {self.eos_token_id}/{self.bos_token_id} must be < vocab {self.vocab_size}")


@dataclass(frozen=True)
class ParlerConfig:
    """The whole model but the codec (upstream's ``ParlerTTSConfig``; :func:`.keymap.config_from_upstream`)."""

    text_encoder: dict[str, Any]  # a T5 config dict (upstream config.json's "text_encoder")
    decoder: ParlerDecoderConfig
    prompt_vocab_size: int  # upstream's top-level vocab_size: the transcript tokenizer's
    audio_encoder: dict[str, Any] = field(default_factory=dict)  # kept for the codec side, unused here

    def t5_config(self) -> T5Config:
        return T5Config.from_dict(self.text_encoder)

    @property
    def projects_encoder(self) -> bool:
        """Whether ``enc_to_dec_proj`` exists (T5 width differs from the decoder's)."""
        return int(self.text_encoder["d_model"]) != self.decoder.hidden_size
