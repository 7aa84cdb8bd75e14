"""Small DSP helpers shared by the built-in codec and the metrics: mel filterbank, STFT, Griffin-Lim.

Written in numpy/torch because librosa and torchaudio are not dependencies. The mel scale is the
Slaney one (linear below 1 kHz, logarithmic above) with area-normalised triangles, the same as
librosa's default (``htk=False, norm="slaney"``).
"""

from __future__ import annotations

import numpy as np
import torch

# Slaney mel scale constants: 3 mels per 200 Hz up to 1 kHz, then log steps of ln(6.4) / 27.
_F_SP = 200.0 / 3.0
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOG_STEP = np.log(6.4) / 27.0

# Floor of mel amplitudes before the log: about -100 dB, keeps digital silence finite.
LOG_FLOOR = 1e-5


def hz_to_mel(hz: np.ndarray | float) -> np.ndarray:
    """Frequency in Hz -> Slaney mel (float64, same shape)."""
    hz = np.asarray(hz, dtype=np.float64)
    lin = hz / _F_SP
    log = _MIN_LOG_MEL + np.log(np.maximum(hz, 1e-12) / _MIN_LOG_HZ) / _LOG_STEP
    return np.where(hz >= _MIN_LOG_HZ, log, lin)


def mel_to_hz(mel: np.ndarray | float) -> np.ndarray:
    """Slaney mel -> frequency in Hz (float64, same shape)."""
    mel = np.asarray(mel, dtype=np.float64)
    lin = mel * _F_SP
    log = _MIN_LOG_HZ * np.exp(_LOG_STEP * (mel - _MIN_LOG_MEL))
    return np.where(mel >= _MIN_LOG_MEL, log, lin)


def mel_filterbank(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> np.ndarray:
    """Triangular mel filters: float32 [n_mels, n_fft // 2 + 1], applied as ``fb @ spectrum``.

    Frequencies in Hz; ``fmax`` defaults to Nyquist. Each triangle is scaled to unit area
    (Slaney normalisation) so that bands of different widths have comparable energy.
    """
    fmax = sample_rate / 2 if fmax is None else fmax
    if not 0 <= fmin < fmax <= sample_rate / 2:
        raise ValueError(
            f"mel band edges must satisfy 0 <= fmin < fmax <= sample_rate/2, got fmin={fmin}, "
            f"fmax={fmax}, sample_rate={sample_rate}; lower fmax or raise the sample rate"
        )
    fft_hz = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges_hz = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    widths = np.diff(edges_hz)  # [n_mels + 1]
    ramps = edges_hz[:, None] - fft_hz[None, :]  # [n_mels + 2, F]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    fb = np.maximum(0.0, np.minimum(lower, upper))
    fb *= (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]
    return fb.astype(np.float32)


def hann_window(n_fft: int) -> torch.Tensor:
    """Periodic Hann window, float32 [n_fft] (the STFT/ISTFT pair below uses it on both sides)."""
    return torch.hann_window(n_fft, periodic=True, dtype=torch.float32)


def stft(wav: torch.Tensor, n_fft: int, hop_length: int) -> torch.Tensor:
    """wav: float32 [N] -> complex64 [n_fft // 2 + 1, 1 + N // hop_length].

    Centred frames with zero padding (reflect padding fails on clips shorter than n_fft / 2).
    """
    return torch.stft(
        wav,
        n_fft=n_fft,
        hop_length=hop_length,
        window=hann_window(n_fft),
        center=True,
        pad_mode="constant",
        return_complex=True,
    )


def istft(spec: torch.Tensor, n_fft: int, hop_length: int, length: int | None = None) -> torch.Tensor:
    """complex [n_fft // 2 + 1, T] -> float32 [length or (T - 1) * hop_length] (inverse of :func:`stft`)."""
    return torch.istft(
        spec, n_fft=n_fft, hop_length=hop_length, window=hann_window(n_fft), center=True, length=length
    )


def log_mel(wav: np.ndarray, fb: np.ndarray, n_fft: int, hop_length: int) -> np.ndarray:
    """wav: float32 [N] -> natural-log mel amplitude, float32 [n_mels, 1 + N // hop_length].

    ``fb`` is a :func:`mel_filterbank` matrix; the mel bands sum STFT magnitudes (not power).
    """
    mag = stft(torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32)), n_fft, hop_length).abs()
    mel = torch.from_numpy(fb) @ mag
    return torch.log(mel.clamp_min(LOG_FLOOR)).numpy()


def griffin_lim(
    mag: torch.Tensor, n_fft: int, hop_length: int, n_iter: int, momentum: float = 0.99, seed: int = 0
) -> torch.Tensor:
    """Phase reconstruction: magnitude float32 [n_fft // 2 + 1, T] -> wav float32 [(T - 1) * hop_length].

    Fast Griffin-Lim (Perraudin et al. 2013, the torchaudio default momentum 0.99). The initial
    phase comes from a generator seeded with ``seed`` so that decoding is deterministic.
    """
    gen = torch.Generator().manual_seed(seed)
    phase = torch.rand(mag.shape, generator=gen) * (2 * np.pi)
    angles = torch.polar(torch.ones_like(mag), phase)
    length = (mag.shape[-1] - 1) * hop_length
    previous = torch.zeros_like(angles)
    for _ in range(n_iter):
        wav = istft(mag * angles, n_fft, hop_length, length=length)
        rebuilt = stft(wav, n_fft, hop_length)
        angles = rebuilt - (momentum / (1 + momentum)) * previous
        angles = angles / angles.abs().clamp_min(1e-16)
        previous = rebuilt
    return istft(mag * angles, n_fft, hop_length, length=length)


def dct_matrix(n_in: int, n_out: int) -> np.ndarray:
    """Orthonormal DCT-II basis, float64 [n_out, n_in]: ``dct_matrix(n, k) @ x`` gives the first k coefficients."""
    k = np.arange(n_out)[:, None]
    n = np.arange(n_in)[None, :]
    basis = np.cos(np.pi / n_in * (n + 0.5) * k) * np.sqrt(2.0 / n_in)
    basis[0] /= np.sqrt(2.0)
    return basis
