"""The ``model:`` section of a run config when ``model.family: parler``.

Imported by :mod:`voxrelay.config`, so it must stay free of torch/transformers (``--help`` and
``config show`` import it).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from voxrelay.models.base import DataNeeds
from voxrelay.models.lora_config import WEIGHTS_DTYPE_HELP, WeightsDtype
from voxrelay.models.seam import FamilyConfig

# Upstream's sizes and ids (helpers/model_init_scripts/init_model_600M.py, training_configs/*.json, the model
# cards): one decoder for the minis (1024 wide, 24 layers, 16 heads, FFN 4096, 4096 positions, dropout 0.1),
# the description encoder and the tokenizers differ. v1.1 tokenizes the transcript with its own tokenizer
# (the model repo's), not the description's T5 one: mixing them up is upstream users' known stumbling block.
PRESETS: dict[str, dict[str, Any]] = {
    "mini-v0.1": {"text_encoder": "google/flan-t5-base", "prompt_tokenizer": "google/flan-t5-base",
                  "hidden_size": 1024, "num_layers": 24, "num_heads": 16, "ffn_dim": 4096,
                  "max_position_embeddings": 4096, "dropout": 0.1},
    "mini-v1": {"text_encoder": "google/flan-t5-large", "prompt_tokenizer": "google/flan-t5-large",
                "hidden_size": 1024, "num_layers": 24, "num_heads": 16, "ffn_dim": 4096,
                "max_position_embeddings": 4096, "dropout": 0.1},
    "mini-v1.1": {"text_encoder": "google/flan-t5-large", "prompt_tokenizer": "parler-tts/parler-tts-mini-v1.1",
                  "hidden_size": 1024, "num_layers": 24, "num_heads": 16, "ffn_dim": 4096,
                  "max_position_embeddings": 4096, "dropout": 0.1},
    # CPU tests and smoke runs: give text_encoder and prompt_tokenizer as local folders
    "tiny": {"text_encoder": None, "prompt_tokenizer": None, "hidden_size": 32, "num_layers": 2, "num_heads": 2,
             "ffn_dim": 64, "max_position_embeddings": 1024, "dropout": 0.1},
}
# The config.json of the presets' description encoders (T5 v1.1 layout): planning needs no download
_T5 = {"model_type": "t5", "feed_forward_proj": "gated-gelu", "vocab_size": 32128, "d_kv": 64,
       "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128, "dropout_rate": 0.1,
       "layer_norm_epsilon": 1e-6, "tie_word_embeddings": False, "is_encoder_decoder": True, "pad_token_id": 0,
       "eos_token_id": 1, "decoder_start_token_id": 0}
KNOWN_T5: dict[str, dict[str, Any]] = {
    "google/flan-t5-base": _T5 | {"d_model": 768, "d_ff": 2048, "num_heads": 12, "num_layers": 12,
                                  "num_decoder_layers": 12, "_name_or_path": "google/flan-t5-base"},
    "google/flan-t5-large": _T5 | {"d_model": 1024, "d_ff": 2816, "num_heads": 16, "num_layers": 24,
                                   "num_decoder_layers": 24, "_name_or_path": "google/flan-t5-large"},
}
SIZE_KEYS = ("hidden_size", "num_layers", "num_heads", "ffn_dim", "max_position_embeddings", "dropout")


class ParlerFamilyConfig(FamilyConfig):
    """Parler-TTS (huggingface/parler-tts 0.2.3, weight-compatible): a T5 encoder reads the ``description``
    (voice, style, recording conditions), the transcript's embeddings are prepended to the decoder's input,
    and a Musicgen-style decoder predicts DAC codes (9 codebooks x 1024, 44.1 kHz at 86 frames/s) with
    Parler's delay pattern, one head and one loss term per codebook.

    ``init_from`` an upstream model (a hub id such as parler-tts/parler-tts-mini-v1, a folder, or an upstream
    ``output_dir/checkpoint-*``) or a voxrelay export fine-tunes it; without it the decoder is random with
    the preset's sizes (training from scratch, as seed 000) and the description encoder is ``text_encoder``'s
    pretrained T5.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    # keys whose default changed: the old default, which a saved config holds when its run did not set the key (a
    # resumed run keeps it unless this session's config sets the key, see voxrelay.train.build)
    CHANGED_DEFAULTS: ClassVar[dict[str, object]] = {"weights_dtype": "float32"}

    family: Literal["parler"] = Field(
        "parler", description="Model family (src/voxrelay/models/<family>/); the other model.* keys depend on it"
    )
    preset: Literal["mini-v0.1", "mini-v1", "mini-v1.1", "tiny"] = Field(
        "mini-v1", description="Upstream's sizes, description encoder and tokenizers: mini-v0.1 (flan-t5-base, "
        "647M), mini-v1 / mini-v1.1 (flan-t5-large, 880M; v1.1 has its own transcript tokenizer), tiny (tests)",
    )
    init_from: str | None = Field(
        None, description="Pretrained Parler: hub id or folder of an upstream model or of an upstream "
        "output_dir/checkpoint-* (or a voxrelay export); None = a new decoder with the preset's sizes",
    )
    text_encoder: str | None = Field(
        None, description="T5 description encoder, hub id or folder (None = init_from's, else the preset's)"
    )
    description_tokenizer: str | None = Field(
        None, description="Tokenizer of the descriptions (None = text_encoder's, else init_from's T5 tokenizer)"
    )
    prompt_tokenizer: str | None = Field(
        None, description="Tokenizer of the transcripts (None = the preset's; for mini-v1.1 init_from's own)"
    )
    freeze_text_encoder: bool = Field(
        True, description="Keep the T5 encoder frozen (upstream's freeze_text_encoder; rebuilt, never checkpointed)"
    )
    codebook_weights: list[float] | None = Field(
        None, description="Loss weight per codebook (None = each codebook's mean counts equally, as upstream)"
    )
    max_description_tokens: int = Field(256, gt=0, description="Descriptions are cut to this many tokens")
    max_prompt_tokens: int = Field(600, gt=0, description="Longest transcript in tokens (upstream max_text_length)")
    hidden_size: int | None = Field(None, gt=0, description="New decoder only: width (None = the preset's)")
    num_layers: int | None = Field(None, gt=0, description="New decoder only: layers (None = the preset's)")
    num_heads: int | None = Field(None, gt=0, description="New decoder only: attention heads (None = the preset's)")
    ffn_dim: int | None = Field(None, gt=0, description="New decoder only: MLP width (None = the preset's)")
    max_position_embeddings: int | None = Field(
        None, gt=0, description="New decoder only: positions over transcript + audio frames (None = the preset's; "
        "4096 fits 30 s at 86 frames/s with a 1,500-token transcript)",
    )
    dropout: float | None = Field(None, ge=0, lt=1, description="Decoder dropout (None = the preset's, 0.1)")
    weights_dtype: WeightsDtype = Field("auto", description=WEIGHTS_DTYPE_HELP)

    @model_validator(mode="after")
    def _sizes(self) -> ParlerFamilyConfig:
        sizes = self.sizes()
        if sizes["hidden_size"] % sizes["num_heads"]:
            raise ValueError(f"hidden_size ({sizes['hidden_size']}) must be divisible by num_heads "
                             f"({sizes['num_heads']})")
        if self.codebook_weights is not None and (not self.codebook_weights or min(self.codebook_weights) < 0
                                                  or sum(self.codebook_weights) <= 0):
            raise ValueError("codebook_weights must be non-negative with a positive sum, one per codebook")
        return self

    def sizes(self) -> dict[str, Any]:
        """The decoder's sizes: each key set here, else the preset's."""
        preset = PRESETS[self.preset]
        return {key: preset[key] if getattr(self, key) is None else getattr(self, key) for key in SIZE_KEYS}

    def encoder_source(self) -> str | None:
        """Where the T5 description encoder comes from when there is no init_from."""
        return self.text_encoder or PRESETS[self.preset]["text_encoder"]

    def prompt_tokenizer_source(self) -> str | None:
        """Where the transcript tokenizer comes from (None: init_from's, or the description tokenizer's)."""
        if self.prompt_tokenizer:
            return self.prompt_tokenizer
        if self.preset == "mini-v1.1" and self.init_from:
            return self.init_from
        return PRESETS[self.preset]["prompt_tokenizer"]

    def data_needs(self) -> DataNeeds:
        """Codes of Parler's DAC (parler-tts/dac_44khZ_8kbps: 9 codebooks x 1024, every released Parler uses it)
        and a description for every row."""
        return DataNeeds(codes=(9, 1024), codec="dac", fields=("description",))
