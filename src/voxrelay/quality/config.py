"""The ``eval`` section: what every evaluation scores besides loss and MCD-DTW."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from voxrelay.config.fields import switch_section


class AsrConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        "auto", description="Whisper for WER/CER: `auto` (packaged base, else packaged tiny.en, else base.en from "
        "the hub), a faster-whisper size (`base.en`, `large-v3`), a local Whisper folder or a hub id, CTranslate2's "
        "(`Systran/faster-whisper-large-v3`) or transformers' (`openai/whisper-large-v3`: converted once, cached)",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where Whisper runs (auto: cuda when present)")
    language: str = Field("en", description="Language of the eval texts (Whisper language code)")
    beam_size: int = Field(
        5, ge=1, description="Whisper's beam width (5, Whisper's own setting; 1 = greedy, faster, but it can loop "
        "on unclear speech and repeat one phrase over a whole packed window)",
    )
    batch_size: int | None = Field(
        None, ge=1, description="Packed windows Whisper decodes at once (faster-whisper's batched pipeline); "
        "null: 8 on a GPU, 1 (one window after another) on a CPU, where batching gains nothing",
    )


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    asr: AsrConfig | None = Field(
        default_factory=AsrConfig, description="Intelligibility: transcribe the eval samples with Whisper and "
        "report eval/wer and eval/cer (needs `pip install 'voxrelay[eval]'`); null or false: off",
    )
    temperature: float = Field(
        0.8, ge=0, description="Sampling temperature of the eval samples (0 = greedy; `synthesize --temperature` "
        "defaults to 0.8 too)",
    )
    top_k: int | None = Field(50, ge=0, description="Top-k of the eval samples' sampling (null or 0: all codes)")
    top_p: float | None = Field(
        None, gt=0, le=1, description="Top-p of the eval samples (null: the family's default, its upstream's; "
        "a family that samples without it refuses a value)",
    )
    repetition_penalty: float | None = Field(
        None, gt=0, description="Repetition penalty of the eval samples (null: the family's default, its "
        "upstream's; a family that samples without it refuses a value)",
    )
    speaker_similarity: bool = Field(
        True, description="Report eval/speaker_sim: cosine of speaker embeddings (resemblyzer's encoder) of each "
        "sample and its reference recording (needs `voxrelay[eval]`)",
    )
    utmos: bool | str = Field(
        False, description="Report eval/utmos: UTMOS22 strong's predicted naturalness MOS (1-5) of each sample, "
        "the UTMOS of F5-TTS' and other papers' tables. true: SpeechMOS' released weights "
        "(utmos22_strong_step7459_v1.pt, 0.4 GB, downloaded once into torch's hub cache); a path or URL of that "
        "file: read from there (offline machines); false: off. Needs no extra",
    )

    @field_validator("asr", mode="before")
    @classmethod
    def _asr(cls, v: Any) -> Any:
        return switch_section(v)
