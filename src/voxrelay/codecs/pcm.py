"""``codec.type: pcm``: the audio itself, as 16-bit PCM at ``codec.sample_rate``, for a family that
learns from continuous features it computes from the waveform (e.g. a σ-VAE's latents).

It is the identity "codec": a row's stored array is ``int16 [1, N]`` (the samples; signed, so unlike
a discrete codec's codes they are not in ``[0, codebook_size)``), ``frame_rate`` is the sample rate
and decoding divides by 32767. Nothing is fitted and nothing is downloaded. Families that learn
discrete codes refuse it (:meth:`voxrelay.models.base.DataNeeds.refusal`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from voxrelay.codecs.base import describe_common, mono_float32

PCM_SCALE = 32767.0


class PcmCodec:
    """Mono 16-bit PCM at ``sample_rate`` (Hz)."""

    name = "pcm"
    continuous = True  # the stored arrays are samples, not codes of a vocabulary
    num_codebooks = 1
    codebook_size = 65536

    def __init__(self, sample_rate: int):
        self.sample_rate = int(sample_rate)
        self.frame_rate = float(sample_rate)

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """float32 [N] in [-1, 1] -> int64 [1, N] samples (clipped, rounded)."""
        wav = mono_float32(wav, self.name)
        return np.round(np.clip(wav, -1.0, 1.0) * PCM_SCALE).astype(np.int64)[None, :]

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """int [1, N] samples -> float32 [N]."""
        return samples(codes)

    def describe(self) -> dict[str, Any]:
        return describe_common(self, encoding="pcm16")


def samples(codes: np.ndarray) -> np.ndarray:
    """Stored 16-bit PCM (int [1, N] or [N]) -> float32 [N] in [-1, 1]."""
    return (np.asarray(codes, dtype=np.float32).reshape(-1) / PCM_SCALE).astype(np.float32)


def is_continuous(codec_description: dict[str, Any]) -> bool:
    """True when prepared data described by ``codec_description`` (index.json's ``codec``) holds audio,
    not discrete codes."""
    return codec_description.get("type") == PcmCodec.name
