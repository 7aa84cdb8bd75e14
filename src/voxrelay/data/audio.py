"""Audio I/O for the data pipeline: decode, mono, resample (soxr), trim, validate.

Waveforms are float32 numpy arrays in [-1, 1]: ``[N]`` for mono, ``[N, C]`` for C channels,
with the sample rate in Hz carried next to them. Only this module decodes audio files.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from voxrelay import storage
from voxrelay.data.types import RowError, Utterance

# Key of ``Utterance.extra`` holding still-encoded audio (e.g. the bytes of an HF Audio column):
# decoding is deferred to ``load_utterance_audio`` so a reader never holds decoded corpora in memory.
AUDIO_BYTES_KEY = "audio_bytes"


def load_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """Decode an audio file (wav, flac, ogg, ... anything libsndfile reads): a local path or a ``gs://`` /
    ``s3://`` URI, read through :mod:`voxrelay.storage` by ranges (the object is streamed, not copied first).

    Returns ``(wav, sample_rate)``: wav float32 ``[N]`` for a mono file, ``[N, C]`` otherwise.
    Raises FileNotFoundError when the file is missing and ``sf.LibsndfileError`` (a RuntimeError)
    when it cannot be decoded.
    """
    if not storage.is_uri(str(path)):
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"audio file {str(p)!r} does not exist")
        wav, sr = sf.read(str(p), dtype="float32", always_2d=False)
        return np.asarray(wav, dtype=np.float32), int(sr)
    with storage.open_read(str(path)) as f:
        wav, sr = sf.read(f, dtype="float32", always_2d=False)
    return np.asarray(wav, dtype=np.float32), int(sr)


def decode_audio_bytes(data: bytes) -> tuple[np.ndarray, int]:
    """Decode an encoded audio file held in memory; same return value as :func:`load_audio`."""
    wav, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=False)
    return np.asarray(wav, dtype=np.float32), int(sr)


def to_mono(wav: np.ndarray) -> np.ndarray:
    """``[N]`` or ``[N, C]`` -> float32 ``[N]`` (mean over channels)."""
    if wav.ndim == 1:
        return wav.astype(np.float32, copy=False)
    if wav.ndim != 2:
        raise ValueError(f"expected a waveform of shape [N] or [N, C], got shape {wav.shape}")
    return wav.mean(axis=1, dtype=np.float32)


def resample(wav: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Resample ``[N]`` or ``[N, C]`` from ``sr_in`` Hz to ``sr_out`` Hz (soxr, high quality)."""
    if sr_in <= 0 or sr_out <= 0:
        raise ValueError(f"sample rates must be positive, got sr_in={sr_in}, sr_out={sr_out}")
    if sr_in == sr_out:
        return wav.astype(np.float32, copy=False)
    return soxr.resample(wav.astype(np.float32, copy=False), sr_in, sr_out, quality="HQ").astype(np.float32)


def trim_silence(wav: np.ndarray, sample_rate: int, threshold_db: float = -40.0, margin_s: float = 0.05) -> np.ndarray:
    """Cut leading/trailing samples quieter than ``threshold_db`` below the peak of mono ``[N]``.

    ``margin_s`` seconds of the quiet part are kept at each end so onsets/offsets are not clipped.
    An all-silent clip is returned unchanged (rejecting it is the validator's job).
    """
    if wav.size == 0:
        return wav
    level = np.abs(wav)
    peak = float(level.max())
    if peak <= 0.0:
        return wav
    loud = np.flatnonzero(level >= peak * 10.0 ** (threshold_db / 20.0))
    margin = int(round(margin_s * sample_rate))
    start = max(int(loud[0]) - margin, 0)
    end = min(int(loud[-1]) + 1 + margin, wav.shape[0])
    return wav[start:end]


def write_wav(path: str | Path, wav: np.ndarray, sample_rate: int) -> Path:
    """Write float32 ``[N]`` / ``[N, C]`` in [-1, 1] (or int16) as 16-bit PCM WAV; returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if wav.dtype != np.int16:
        wav = np.clip(wav, -1.0, 1.0)
    sf.write(str(p), wav, int(sample_rate), subtype="PCM_16", format="WAV")
    return p


def _decode_utterance(utt: Utterance) -> tuple[np.ndarray, int]:
    """Raw samples of an utterance from whichever of path / array / bytes it carries."""
    if utt.audio is not None:
        if not utt.sample_rate or utt.sample_rate <= 0:
            raise RowError(f"in-memory audio has no valid sample_rate ({utt.sample_rate!r}); the reader must set it")
        return np.asarray(utt.audio, dtype=np.float32), int(utt.sample_rate)
    encoded = utt.extra.get(AUDIO_BYTES_KEY)
    if encoded is not None:
        try:
            return decode_audio_bytes(encoded)
        except (sf.LibsndfileError, RuntimeError, TypeError) as e:
            raise RowError(f"unreadable audio bytes ({_short(e)}); re-encode it as WAV or FLAC") from None
    if not utt.audio_path:
        raise RowError("no audio (neither a path nor samples); fill the audio column")
    try:
        return load_audio(utt.audio_path)
    except FileNotFoundError:
        raise RowError(f"audio file missing: {utt.audio_path}; fix the path or remove the row") from None
    except (sf.LibsndfileError, RuntimeError) as e:
        raise RowError(
            f"unreadable or corrupt audio file {utt.audio_path} ({_short(e)}); re-export it as WAV or FLAC"
        ) from None


def _short(err: Exception) -> str:
    return str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__


def load_utterance_audio(utt: Utterance, target_sr: int, min_duration: float, max_duration: float) -> np.ndarray:
    """Decode, validate, downmix and resample one utterance.

    Returns float32 mono ``[N]`` at ``target_sr`` Hz. Raises :class:`RowError` with a short reason
    when the audio is missing, unreadable, empty, contains NaN/inf, or its duration (seconds, of the
    source audio) lies outside ``[min_duration, max_duration]``. The message is the bare reason
    (like ``Utterance.problem``); the caller pairs it with ``utt.where``.
    """
    wav, sr = _decode_utterance(utt)
    if wav.ndim not in (1, 2):
        raise RowError(f"audio has shape {wav.shape}; expected [samples] or [samples, channels]")
    n = wav.shape[0]
    if n == 0 or wav.size == 0:
        raise RowError("audio has no samples; re-export the file or remove the row")
    bad = int(np.count_nonzero(~np.isfinite(wav)))
    if bad:
        raise RowError(f"audio has {bad} NaN/inf samples out of {wav.size}; re-export the file")
    duration = n / sr
    if duration < min_duration:
        raise RowError(f"too short: {duration:.2f} s < data.min_duration {min_duration} s")
    if duration > max_duration:
        raise RowError(f"too long: {duration:.2f} s > data.max_duration {max_duration} s")
    return resample(to_mono(wav), sr, target_sr)
