"""mcd_dtw: zero on identity, grows with distortion, tolerant of timing; DTW against a reference. Its speed is
measured by bench/mcd_speed.py."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from voxrelay.quality.mcd import dtw_path_mean, mcd_dtw, mel_cepstrum

SR = 16000


def speechlike(seconds: float, seed: int = 0, sr: int = SR) -> np.ndarray:
    """Harmonics of a gliding f0 with a syllable-rate envelope plus faint noise, float32 [N]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    f0 = 140 * (1 + 0.3 * np.sin(2 * np.pi * 0.7 * t))
    phase = 2 * np.pi * np.cumsum(f0) / sr
    wav = sum(np.sin(k * phase) / k for k in range(1, 25)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t) ** 2)
    return (0.1 * wav + 0.002 * rng.standard_normal(t.size)).astype(np.float32)


def with_noise(wav: np.ndarray, snr_db: float, seed: int = 1) -> np.ndarray:
    noise = np.random.default_rng(seed).standard_normal(wav.size)
    noise *= np.sqrt(np.mean(wav**2) / np.mean(noise**2) / 10 ** (snr_db / 10))
    return (wav + noise).astype(np.float32)


def reference_dtw_mean(cost: np.ndarray) -> float:
    """Plain O(I*J) loops + backtracking: the textbook algorithm the vectorised one must match."""
    n_i, n_j = cost.shape
    acc = np.full((n_i + 1, n_j + 1), np.inf)
    acc[0, 0] = 0.0
    for i in range(1, n_i + 1):
        for j in range(1, n_j + 1):
            acc[i, j] = cost[i - 1, j - 1] + min(acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1])
    i, j, steps = n_i, n_j, 1
    while (i, j) != (1, 1):
        moves = [(acc[i - 1, j - 1], i - 1, j - 1), (acc[i - 1, j], i - 1, j), (acc[i, j - 1], i, j - 1)]
        _, i, j = min(moves, key=lambda m: m[0])
        steps += 1
    return acc[n_i, n_j] / steps


def test_identical_audio_scores_zero() -> None:
    wav = speechlike(1.0)
    assert mcd_dtw(wav, wav, SR) < 1e-6


def test_gain_change_costs_nothing() -> None:
    wav = speechlike(1.0)
    assert mcd_dtw(wav, 0.3 * wav, SR) < 1e-3  # c0 (loudness) is excluded


def test_grows_with_distortion() -> None:
    wav = speechlike(1.5)
    scores = [mcd_dtw(wav, with_noise(wav, snr), SR) for snr in (40, 20, 10, 0)]
    assert all(a < b for a, b in zip(scores, scores[1:], strict=False)), scores
    assert scores[0] > 0.1


def test_time_shift_is_absorbed_by_dtw() -> None:
    wav = speechlike(2.0)
    shifted = np.concatenate([np.zeros(800, np.float32), wav[:-800]])  # 50 ms later
    padded = np.concatenate([np.zeros(4000, np.float32), wav])  # 0.25 s of silence first
    noisy = mcd_dtw(wav, with_noise(wav, 10), SR)
    assert mcd_dtw(wav, shifted, SR) < 2.0
    assert mcd_dtw(wav, shifted, SR) < 0.25 * noisy
    assert mcd_dtw(wav, padded, SR) < 0.5 * noisy


def test_symmetric() -> None:
    a, b = speechlike(1.0, 0), with_noise(speechlike(1.2, 0), 15)
    assert mcd_dtw(a, b, SR) == pytest.approx(mcd_dtw(b, a, SR), rel=1e-9)


def test_other_sample_rates_are_resampled_to_16k() -> None:
    wav16 = speechlike(1.0)
    wav24 = soxr.resample(wav16, SR, 24000).astype(np.float32)
    assert mcd_dtw(wav24, wav24, 24000) < 1e-6
    c16, c24 = mel_cepstrum(wav16, SR), mel_cepstrum(wav24, 24000)
    assert c16.shape == c24.shape == (1 + wav16.size // 160, 24)
    assert np.abs(c16 - c24).mean() < 0.1 * np.abs(c16).mean()


def test_dtw_matches_reference_algorithm() -> None:
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (1, 5), (6, 1), (7, 7), (9, 13), (15, 4)]:
        cost = rng.uniform(0, 1, size=shape)
        assert dtw_path_mean(cost) == pytest.approx(reference_dtw_mean(cost), rel=1e-12), shape
    # a diagonal of zeros is found exactly
    cost = np.abs(np.subtract.outer(np.arange(20.0), np.arange(20.0)))
    assert dtw_path_mean(cost) == 0.0


# its speed (0.5 s for two 5 s clips) is a bench, not a test: bench/mcd_speed.py


@pytest.mark.parametrize("bad", [np.zeros(0, np.float32), np.zeros((2, 100), np.float32)])
def test_rejects_empty_or_multichannel(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="mono"):
        mcd_dtw(bad, speechlike(0.5), SR)


def test_rejects_nan() -> None:
    wav = speechlike(0.5)
    wav[10] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        mcd_dtw(speechlike(0.5), wav, SR)


def test_silent_fraction_counts_the_quiet_frames():
    from voxrelay.quality.mcd import silent_fraction

    sr = 16000
    tone = 0.3 * np.sin(2 * np.pi * 220 * np.arange(sr) / sr)
    assert silent_fraction(tone, sr) == 0.0
    assert silent_fraction(np.zeros(sr), sr) == 1.0
    half = np.concatenate([tone[: sr // 2], 1e-4 * tone[: sr // 2]])  # -80 dB below the tone
    assert silent_fraction(half, sr) == pytest.approx(0.5, abs=0.03)
    assert silent_fraction(np.zeros(0), sr) == 1.0
