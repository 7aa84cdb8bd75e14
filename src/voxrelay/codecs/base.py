"""The AudioCodec protocol and the registry of codec implementations.

A codec turns mono audio into discrete codes and back:

    codes = codec.encode(wav)   # wav: float32 [N] at codec.sample_rate -> codes: int64 [K, T]
    wav = codec.decode(codes)   # codes: int [K, T] -> float32 [N] at codec.sample_rate

K is ``num_codebooks`` and T = ceil-ish(N / sample_rate * frame_rate). Every codebook holds
``codebook_size`` entries, so a code is in ``[0, codebook_size)``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from voxrelay.errors import UserError


class CodecError(UserError, ValueError):
    """A codec cannot be built or loaded (``codec.path``, a missing package, a changed codec);
    the message names the path or key and the fix."""


class CodecNotFoundError(CodecError, FileNotFoundError):
    """``codec.path`` is neither a codec folder nor a hub id that can be loaded."""


def looks_local(spec: str) -> bool:
    """True when ``spec`` can only be a local path (a codec's hub id is exactly ``owner/name``, as
    huggingface_hub accepts it)."""
    from voxrelay.models.hf import looks_local as not_a_hub_id

    return spec.count("/") != 1 or not_a_hub_id(spec)


@runtime_checkable
class AudioCodec(Protocol):
    """What the rest of voxrelay needs from a codec."""

    name: str
    sample_rate: int
    frame_rate: float
    num_codebooks: int
    codebook_size: int

    def encode(self, wav: np.ndarray) -> np.ndarray:
        """wav: float32 [N] mono at ``sample_rate`` -> codes int64 [K, T]."""
        ...

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """codes: int [K, T] -> wav float32 [N] at ``sample_rate``."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable description (type + parameters) stored in the prepared ``index.json``."""
        ...


@runtime_checkable
class FittableCodec(AudioCodec, Protocol):
    """A codec whose parameters are fitted on the corpus during ``prepare`` (the built-in one).

    Its fitted state travels as bytes (safetensors) next to the prepared shards.
    """

    def fit(self, wavs: list[np.ndarray], seed: int = 0) -> None:
        """Fit on a list of float32 [N] mono clips at ``sample_rate``."""
        ...

    @property
    def is_fitted(self) -> bool: ...

    def state_bytes(self) -> bytes:
        """Serialised fitted state (safetensors bytes)."""
        ...

    def load_state_bytes(self, data: bytes) -> None: ...


def describe_common(codec: AudioCodec, **params: Any) -> dict[str, Any]:
    """The ``describe()`` fields every codec shares, plus its own ``params``."""
    return {
        "type": codec.name,
        "sample_rate": codec.sample_rate,
        "frame_rate": codec.frame_rate,
        "num_codebooks": codec.num_codebooks,
        "codebook_size": codec.codebook_size,
        **params,
    }


def mono_float32(wav: np.ndarray, codec_name: str) -> np.ndarray:
    """Check that ``wav`` is mono float32 [N] with N > 0 (raises ValueError naming the shape)."""
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim != 1 or wav.size == 0:
        raise ValueError(f"{codec_name}: expected mono audio float32 [N] with N > 0, got shape {wav.shape}")
    return wav
