"""The ``model:`` section of a run config when ``model.family: codec_lm``.

Imported by :mod:`voxrelay.config`, so it must stay free of torch/transformers (``--help`` and
``config show`` import it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from voxrelay.models.base import DataNeeds
from voxrelay.models.seam import FamilyConfig


class CodecLMConfig(FamilyConfig):
    """A decoder-only Llama over ``[BOS, text, AUDIO_START, codes frame by frame, AUDIO_END]``."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    family: Literal["codec_lm"] = Field(
        "codec_lm", description="Model family (src/voxrelay/models/<family>/); the other model.* keys depend on it"
    )
    tokenizer: str = Field(
        "bytes", description="'bytes' (UTF-8 bytes), 'phonemes' or 'phonemes:<language>' (eSpeak NG's IPA "
        "transcription, default en-us: pronunciation instead of spelling) or a HF tokenizer name/path",
    )
    init_from: str | None = Field(
        None, description="Pretrained weights: local folder or hub id (None = random init)"
    )
    hidden_size: int = Field(256, gt=0, description="Transformer width")
    num_layers: int = Field(4, gt=0, description="Transformer layers")
    num_heads: int = Field(4, gt=0, description="Attention heads")
    intermediate_size: int = Field(768, gt=0, description="MLP width")
    max_seq_len: int = Field(2048, gt=0, description="Longest token sequence (text + audio codes)")
    dropout: float = Field(0.0, ge=0, lt=1, description="Attention dropout")
    text_position_scale: float | None = Field(
        None, gt=0, description="Rotary positions that put text and audio on one time axis: text token j at "
        "position j * scale, audio frame t at t + 1 (BOS and the audio start at 0), so the phoneme being "
        "spoken sits next to the frame being predicted. Set it to the data's audio frames per text token (the "
        "demo: ~1.75 for phonemes at 50 frames/s). null: one position per token (plain causal LM)",
    )

    frames_per_position: int | None = Field(
        None, ge=1, description="Audio frames per sequence position: a position embeds the K codes of each of its "
        "frames (summed) and predicts the next position's with one head per code, so an utterance takes G times "
        "fewer positions (2 halves the demo's 50 per second of audio). null: one position per code, frame by "
        "frame (Orpheus' layout)",
    )

    audio_embedding: Literal["free", "codec"] = Field(
        "free", description="How audio ids are embedded: 'free' (a learned row per code) or 'codec' (a learned "
        "projection, one per codebook slot, of the codec's own vector of the code, standardised; for mel_kmeans "
        "its centroid's log-mel), so acoustically close codes get close inputs. 'codec' needs a codec with code "
        "vectors (the built-in mel_kmeans) and a random init or a plain LM as model.init_from",
    )

    @model_validator(mode="after")
    def _heads(self) -> CodecLMConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})"
            )
        return self

    def train_refusal(self, lora: bool) -> str | None:
        # (a codec without code vectors is refused when the model is built: the prepared data names the codec)
        if self.audio_embedding == "codec" and lora:
            return ("model.audio_embedding=codec learns its audio inputs from scratch, which LoRA's frozen model "
                    "cannot; set model.audio_embedding=free to train with train.lora")
        return None

    def data_needs(self) -> DataNeeds:
        """Any codec's codes: the vocabulary is sized from the prepared data."""
        return DataNeeds()
