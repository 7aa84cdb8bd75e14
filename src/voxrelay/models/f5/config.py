"""The ``model:`` section of a run config when ``model.family: f5``.

Imported by :mod:`voxrelay.config`, so it must stay free of torch (``--help`` and ``config show`` import it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from voxrelay.models.base import DataNeeds
from voxrelay.models.seam import FamilyConfig

SAMPLE_RATE = 24000
HOP = 256
RANDOM_ONLY = "Random init only"


class F5Config(FamilyConfig):
    """F5-TTS: a DiT learns, by conditional flow matching, to fill a masked span of a clip's log-mel spectrogram given
    the rest and the whole transcript; synthesis fills the frames after a voice prompt (another clip and its text) by
    a sway-sampled ODE with guidance, and Vocos turns the mel into audio. Weight-compatible with f5-tts' checkpoints
    both ways (``init_from`` reads F5TTS_v1_Base's ``model_1250000.safetensors``; exports are that layout)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    family: Literal["f5"] = Field(
        "f5", description="Model family (src/voxrelay/models/<family>/); the other model.* keys depend on it"
    )
    init_from: str | None = Field(
        None, description="Pretrained weights: an f5-tts checkpoint .safetensors (its EMA weights, as the hub's "
        "F5TTS_v1_Base/model_1250000.safetensors, or a model_*.safetensors) or a voxrelay export folder; None = random",
    )
    vocab: str | None = Field(
        None, description="The text vocabulary: the checkpoint's vocab.txt (F5TTS_v1_Base: its pinyin vocab of 2545 "
        "tokens); None: UTF-8 bytes (256 ids, for a model trained from scratch)",
    )
    dropout: float = Field(0.1, ge=0, lt=1, description="Dropout after attention and in the MLP (upstream: 0.1)")
    ema: bool = Field(True, description="Keep an EMA of the weights (upstream's: every 10 steps after 100, decay "
                      "warming up to 0.9999); synthesis, evaluation and export use it")
    vocoder: str | None = Field(
        None, description="Vocos that turns mel into audio, needed to synthesize and evaluate: a folder (config.yaml "
        "+ weights) or a hub id (charactr/vocos-mel-24khz)",
    )
    steps: int = Field(32, gt=0, description="Synthesis: ODE steps (upstream's nfe_step)")
    cfg_strength: float = Field(2.0, ge=0, description="Synthesis: classifier-free guidance strength")
    sway: float | None = Field(-1.0, description="Synthesis: sway sampling coefficient (None: a uniform time grid)")
    max_seconds: float = Field(30.0, gt=0, description="Longest clip learned from (upstream skips clips over 30 s)")
    full_budget_seconds: float = Field(
        15.0, gt=0, description="Batches of clips longer than this hold fewer frames than train.batch_tokens: count x "
        "longest² <= batch_tokens x this many frames (attention's memory grows with the square of a clip's length: a "
        "fixed frame budget runs out of memory on long clips, F5-TTS #223)",
    )
    dim: int = Field(1024, gt=0, description=f"{RANDOM_ONLY}: DiT width (F5TTS_v1_Base: 1024; v1_Small: 768)")
    depth: int = Field(22, gt=0, description=f"{RANDOM_ONLY}: DiT blocks (v1_Base: 22; v1_Small: 18)")
    heads: int = Field(16, gt=0, description=f"{RANDOM_ONLY}: attention heads of 64 channels (v1_Base: 16)")
    ff_mult: int = Field(2, gt=0, description=f"{RANDOM_ONLY}: MLP width / dim")
    text_dim: int = Field(512, gt=0, description=f"{RANDOM_ONLY}: text embedding width")
    conv_layers: int = Field(4, ge=0, description=f"{RANDOM_ONLY}: ConvNeXt blocks over the text")

    @model_validator(mode="after")
    def _shapes(self) -> F5Config:
        if self.dim % 16:
            raise ValueError(f"dim ({self.dim}) must be a multiple of 16 (the convolutional position embedding's "
                             "groups)")
        return self

    def data_needs(self) -> DataNeeds:
        """The audio itself at 24 kHz (the mel is computed from it at every step: cheaper than storing it)."""
        return DataNeeds(audio_rate=SAMPLE_RATE, max_seconds=self.max_seconds,
                         max_seconds_why=f"model.max_seconds={self.max_seconds:g}")

    def text_coverage_fix(self, tokens: list[str]) -> str:
        shown = " ".join(tokens[:10]) + (" ..." if len(tokens) > 10 else "")
        return (f"append them to {self.vocab} ({len(tokens)} lines after its own, one token per line: {shown}); "
                "the checkpoint's text embedding grows by as many rows, drawn at random, as upstream's finetune tool "
                "extends it")

    def text_coverage(self, texts: list[str]) -> list[tuple[str, int, str]] | None:
        """The tokens of ``texts`` (characters, pinyin syllables) ``vocab`` lacks: they read as a space."""
        if self.vocab is None:  # UTF-8 bytes: every character is covered
            return None
        from collections import Counter

        from voxrelay.models.f5.text import Vocab

        vocab = Vocab.read(self.vocab)
        missing = Counter(t for text in texts for t in vocab.unknown(text))
        return [(token, count, "unknown (reads as a space)") for token, count in missing.most_common()]
