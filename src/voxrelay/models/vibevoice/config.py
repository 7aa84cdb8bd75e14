"""The ``model:`` section of a run config when ``model.family: vibevoice``.

Imported by :mod:`voxrelay.config`, so it must stay free of torch/transformers (``--help`` and
``config show`` import it).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from voxrelay.models.base import DataNeeds
from voxrelay.models.lora_config import WEIGHTS_DTYPE_HELP, WeightsDtype
from voxrelay.models.seam import FamilyConfig
from voxrelay.models.vibevoice.script import check_transcript

SAMPLE_RATE = 24000  # every released VibeVoice: 24 kHz audio, one latent per 3200 samples (7.5 per second)
HOP = 3200
# Seconds the two frozen encoders take per hour of audio (bench/vibevoice_features.py): H200 bf16 measured 2026-11-26
# (3.11 s of a step for 1,140 s of audio), 2 CPU cores fp32 measured 2026-11-29 (VibeVoice-1.5B sizes), L4 estimated
# from the H200's by their dense bf16 peaks (989 / 121 TFLOP/s)
ENCODE_S_PER_HOUR = {"an H200": 9.8, "an L4 (est.)": 80.0, "2 CPU cores": 2741.0}
# From here, stored audio costs each training session over 10 minutes of encoding on an L4: store the latents
LATENTS_ADVISED_HOURS = 8.0
LATENT_BYTES_PER_HOUR = (64 + 128) * 4 * 7.5 * 3600  # float32 means + semantic features: 20.7 MB
AUDIO_BYTES_PER_HOUR = 138e6  # 24 kHz 16-bit in zstd Parquet (bench/vibevoice_features.py)
# tokens of an example besides its latents: the system line, "Voice input:", "Text input:", "Speech output:",
# the audio start/end tokens, end of text (what prepare allows for when it rejects audio too long for max_length)
FIXED_TOKENS = 64


class VibeVoiceFamilyConfig(FamilyConfig):
    """VibeVoice (microsoft, as converted to transformers 5.x: ``VibeVoiceForConditionalGeneration``): a Qwen2
    LM reads a chat-format script (speakers as roles 0, 1, ...) and voice prompts, then emits one audio token
    per acoustic latent (7.5 per second of 24 kHz audio); a diffusion head turns each such position's hidden
    state into the latent, which the frozen σ-VAE decodes to audio.

    Fine-tunes ``init_from`` (a ``*-hf`` checkpoint: hub id or folder, or a voxrelay export): the acoustic and
    semantic tokenizers stay frozen (rebuilt from it, never checkpointed); the LM, connectors and diffusion
    head train (under ``train.lora``: adapters on the LM, plus the head and connectors when asked). The loss
    has two terms, ``ce`` (next token over the speech span: audio tokens, end of speech, end of text) and
    ``diffusion`` (v-prediction on the target latents only, conditioned on the hidden state one position
    earlier, timesteps over the whole schedule).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    # keys whose default changed: the old default, which a saved config holds when its run did not set the key (a
    # resumed run keeps it unless this session's config sets the key, see voxrelay.train.build)
    CHANGED_DEFAULTS: ClassVar[dict[str, object]] = {"weights_dtype": "float32"}

    family: Literal["vibevoice"] = Field(
        "vibevoice", description="Model family (src/voxrelay/models/<family>/); the other model.* keys depend on it"
    )
    init_from: str = Field(
        "vibevoice/VibeVoice-1.5B-hf", description="VibeVoice checkpoint in transformers' layout: hub id (e.g. "
        "bezzam/VibeVoice-1.5B-hf) or local folder, or a voxrelay export of one",
    )
    preset: Literal["1.5B", "7B"] = Field(
        "1.5B", description="Sizes `plan` uses when init_from is not a local folder (no download for planning)"
    )
    tokenizer: str | None = Field(None, description="Qwen2 tokenizer folder or hub id (None = init_from's)")
    max_length: int = Field(
        8192, gt=FIXED_TOKENS, description="Longest example in tokens: script text + voice prompts' latents + "
        "target latents (7.5 per second); prepare rejects audio that cannot fit",
    )
    voice_prompt_drop_rate: float = Field(
        0.2, ge=0, le=1, description="Share of examples trained without their voice prompts (fixed per row by "
        "train.seed), so the model also speaks without them",
    )
    ddpm_batch_multiplier: int = Field(4, gt=0, description="Noise draws per target latent in the diffusion loss")
    feature_cache_gb: float = Field(
        2.0, ge=0, description="CPU memory per process for the frozen encoders' outputs (σ-VAE means, semantic "
        "features: 20.7 MB per hour of audio), so each clip is encoded once per run, not at every step; 0 = off",
    )
    ce_loss_weight: float = Field(1.0, ge=0, description="Weight of the `ce` term")
    diffusion_loss_weight: float = Field(1.0, ge=0, description="Weight of the `diffusion` term")
    ema_decay: float | None = Field(
        0.999, gt=0, lt=1, description="EMA of the diffusion head's weights (saved in every checkpoint, used by "
        "eval, synthesize and export); None = off",
    )
    train_diffusion_head: bool = Field(
        True, description="Under train.lora: train the diffusion head in full beside the adapters"
    )
    train_connectors: bool = Field(
        False, description="Under train.lora: train the acoustic and semantic connectors in full too"
    )
    diffusion_steps: int = Field(10, gt=0, description="Denoising steps per latent at synthesis")
    guidance_scale: float = Field(1.3, ge=0, description="Classifier-free guidance of the diffusion at synthesis")
    dropout: float = Field(0.0, ge=0, lt=1, description="Attention dropout of the LM (upstream: 0)")
    weights_dtype: WeightsDtype = Field("auto", description=WEIGHTS_DTYPE_HELP)

    @model_validator(mode="after")
    def _weights(self) -> VibeVoiceFamilyConfig:
        if self.ce_loss_weight + self.diffusion_loss_weight <= 0:
            raise ValueError("ce_loss_weight and diffusion_loss_weight cannot both be 0")
        return self

    def max_seconds(self) -> float:
        """Longest audio whose latents fit ``max_length`` with the fixed tokens (text and prompts come on top)."""
        return math.floor((self.max_length - FIXED_TOKENS) * HOP / SAMPLE_RATE * 10) / 10

    def host_cache_bytes(self) -> int:
        """The encoded-feature cache (``feature_cache_gb``) each process keeps."""
        return int(self.feature_cache_gb * 2**30)

    def data_needs(self) -> DataNeeds:
        """The audio itself at 24 kHz (the family encodes it with its own frozen tokenizers), or those tokenizers'
        outputs computed once by prepare (``codec.type: vibevoice_latents``); transcripts whose speakers match
        ``num_speakers`` (and the row's voice prompts, kept with it), audio that fits ``max_length``."""
        limit = self.max_seconds()
        return DataNeeds(audio_rate=SAMPLE_RATE, features="vibevoice_latents", row_check=check_transcript,
                         voice_prompts=True, max_seconds=limit, advice=self.storage_advice,
                         max_seconds_why=f"model.max_length={self.max_length} allows at most {limit:g} s of audio "
                         "(7.5 latents per second); raise model.max_length or cut the clip")

    def storage_advice(self, index: dict) -> str | None:
        """Past :data:`LATENTS_ADVISED_HOURS` of stored audio: what each session pays to encode it again, and how to
        store the encoders' outputs once instead."""
        hours = float(index.get("hours") or 0.0)  # both splits
        if (index.get("codec") or {}).get("type") != "pcm" or hours < LATENTS_ADVISED_HOURS:
            return None
        costs = ", ".join(f"{hours * s / 60:.0f} min on {where}" for where, s in ENCODE_S_PER_HOUR.items())
        held = self.feature_cache_gb * 2**30 / LATENT_BYTES_PER_HOUR
        cache = (f"; model.feature_cache_gb={self.feature_cache_gb:g} holds {held:.0f} h of them, so the rest is "
                 "encoded again at every epoch") if held < hours else ""
        return (f"{hours:.1f} h of audio are stored as audio (codec.type=pcm): every training session (every resume "
                f"too) encodes each clip again with the frozen encoders ({costs}){cache}. Past "
                f"{LATENTS_ADVISED_HOURS:g} h, store their outputs once: prepare with codec.type=vibevoice_latents "
                f"codec.path={self.init_from} under another data.name ({LATENT_BYTES_PER_HOUR * hours / 1e9:.1f} GB "
                f"instead of about {AUDIO_BYTES_PER_HOUR * hours / 1e9:.1f} GB; prepare on a GPU). A run already "
                "training on this data keeps it (another data.name is refused on resume): start the next run on the "
                "latents. docs/models.md: VibeVoice, feature storage")
