"""Objective speech metrics that need no model download.

``mcd_dtw`` is the mel-cepstral distortion after dynamic time warping, in dB. It compares two
renderings of the same content whatever their timing; about 0 for identical audio, a few dB for a
good vocoder, 10+ dB for a coarse codec, and far more for unrelated sounds.

Definition used here (keep it fixed: numbers are only comparable under one definition):
audio resampled to 16 kHz; STFT with a 512-sample (32 ms) Hann window and a 160-sample (10 ms) hop;
40 Slaney mel bands (0-8 kHz) of the STFT magnitude; natural log (floored at 1e-5); orthonormal
DCT-II; coefficients c1..c24 (c0, the loudness, is dropped, so a gain change costs nothing).
Per frame pair ``(10 / ln 10) * sqrt(2 * sum_d (c_d - c'_d)^2)``, averaged over the DTW path
(steps (1, 0), (0, 1), (1, 1), all of weight 1).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from voxrelay.codecs import dsp

MCD_SAMPLE_RATE = 16000
MCD_N_FFT = 512
MCD_HOP = 160
MCD_N_MELS = 40
MCD_N_CEPS = 24
_MCD_SCALE = 10.0 / math.log(10.0) * math.sqrt(2.0)


@lru_cache(maxsize=1)
def _analysis_matrices() -> tuple[np.ndarray, np.ndarray]:
    """(mel filterbank float32 [n_mels, n_fft // 2 + 1], DCT rows c1..c24 float64 [24, n_mels])."""
    fb = dsp.mel_filterbank(MCD_SAMPLE_RATE, MCD_N_FFT, MCD_N_MELS)
    dct = dsp.dct_matrix(MCD_N_MELS, MCD_N_CEPS + 1)[1:]
    return fb, dct


def mel_cepstrum(wav: np.ndarray, sample_rate: int) -> np.ndarray:
    """wav float [N] mono at ``sample_rate`` Hz -> mel-cepstra c1..c24, float64 [T, 24] (10 ms frames)."""
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim != 1 or wav.size == 0:
        raise ValueError(f"mcd_dtw: expected mono audio float [N] with N > 0, got shape {wav.shape}")
    if not np.isfinite(wav).all():
        raise ValueError("mcd_dtw: audio contains NaN or inf samples; fix the synthesis before scoring")
    if sample_rate != MCD_SAMPLE_RATE:
        import soxr

        wav = soxr.resample(wav, sample_rate, MCD_SAMPLE_RATE).astype(np.float32)
    fb, dct = _analysis_matrices()
    log_mel = dsp.log_mel(wav, fb, MCD_N_FFT, MCD_HOP).astype(np.float64)  # [n_mels, T]
    return (dct @ log_mel).T


def dtw_path_mean(cost: np.ndarray) -> float:
    """Mean of ``cost`` [I, J] along the minimal-total-cost monotone path from (0, 0) to (I-1, J-1).

    Steps (1, 0), (0, 1), (1, 1). The accumulation runs over anti-diagonals so that each of the
    I + J - 1 steps is one vectorised numpy operation; path length is tracked alongside the sum
    (ties broken towards the shorter path), so no backtracking is needed.
    """
    n_i, n_j = cost.shape
    acc = np.full((n_i, n_j), np.inf)
    steps = np.zeros((n_i, n_j), dtype=np.int64)
    acc[0, 0], steps[0, 0] = cost[0, 0], 1
    for d in range(1, n_i + n_j - 1):
        i = np.arange(max(0, d - n_j + 1), min(d, n_i - 1) + 1)
        j = d - i
        # candidate predecessors: up (i-1, j), left (i, j-1), diagonal (i-1, j-1); inf when outside
        up = np.where(i > 0, acc[np.maximum(i - 1, 0), j], np.inf)
        left = np.where(j > 0, acc[i, np.maximum(j - 1, 0)], np.inf)
        diag = np.where((i > 0) & (j > 0), acc[np.maximum(i - 1, 0), np.maximum(j - 1, 0)], np.inf)
        cand = np.stack([diag, up, left])  # diagonal first: argmin prefers it on ties (shorter path)
        choice = cand.argmin(0)
        prev_i = i - (choice != 2)
        prev_j = j - (choice != 1)
        acc[i, j] = cand[choice, np.arange(len(i))] + cost[i, j]
        steps[i, j] = steps[prev_i, prev_j] + 1
    return float(acc[-1, -1] / steps[-1, -1])


def mcd_dtw(ref: np.ndarray, syn: np.ndarray, sample_rate: int) -> float:
    """Mel-cepstral distortion in dB between ``ref`` and ``syn`` (float [N] mono, same ``sample_rate`` Hz).

    See the module docstring for the exact definition. Symmetric in its arguments; two 5 s clips
    take about 0.1 s.
    """
    c_ref = mel_cepstrum(ref, sample_rate)
    c_syn = mel_cepstrum(syn, sample_rate)
    sq_ref = (c_ref**2).sum(1)
    sq_syn = (c_syn**2).sum(1)
    sq_dist = np.maximum(sq_ref[:, None] + sq_syn[None, :] - 2.0 * (c_ref @ c_syn.T), 0.0)
    return _MCD_SCALE * dtw_path_mean(np.sqrt(sq_dist))


SILENCE_DBFS = -50.0  # a 20 ms frame quieter than this counts as silence (eval/silent_frac)


def silent_fraction(wav: np.ndarray, sample_rate: int, frame_s: float = 0.02) -> float:
    """Share of 20 ms frames of ``wav`` quieter than :data:`SILENCE_DBFS` (1.0 for an empty wav): the
    symptom upstream users report of a run that learned to generate silence."""
    hop = max(1, int(sample_rate * frame_s))
    frames = len(wav) // hop
    if frames == 0:
        return 1.0
    power = np.square(wav[: frames * hop].reshape(frames, hop).astype(np.float64)).mean(axis=1)
    return float(np.mean(10 * np.log10(power + 1e-12) < SILENCE_DBFS))
