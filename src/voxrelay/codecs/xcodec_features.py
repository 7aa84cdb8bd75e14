"""The inputs XCodec2 and NeuCodec encode from, computed as transformers' ``Xcodec2FeatureExtractor`` /
``NeuCodecFeatureExtractor`` compute them for one clip, without torchaudio.

Both extractors need torchaudio only for ``torchaudio.compliance.kaldi.fbank``, and no torchaudio wheel exists
for the torch this project runs (FACTS: the newest, 2.11, is pinned to torch 2.11). :func:`kaldi_fbank` is that
function for the options the extractors pass (80 bins, 25 ms povey window, 10 ms shift, pre-emphasis 0.97, DC
offset removed, power spectrum, log, no dither, ``snip_edges``, 20 Hz to Nyquist), with the same torch operations
in the same order; ``tests/unit/codecs/test_xcodec_features.py`` compares it with features that transformers'
extractors computed with torchaudio's own ``kaldi.py`` (``scripts/xcodec_features_golden.py``).

For one clip of N samples at 16 kHz (hop 320 = 2 mel frames of 160):

- acoustic input: the clip, one zero sample appended, zero-padded to L = 320 * ceil((N + 1) / 320);
- semantic input: log-mel frames of ``wav * 2**15``, normalised per bin over the clip (mean 0, unbiased
  variance 1), each two consecutive frames stacked into one 160-dim vector: [L / 320 + ``extra``, 160] where
  XCodec2 first pads the acoustic input with 160 zeros on each side (``extra`` 0) and NeuCodec does not
  (``extra`` -1, so the encoder keeps one code fewer than the acoustic frames).
"""

from __future__ import annotations

import math

import numpy as np
import torch

SAMPLE_RATE = 16000
HOP = 320  # samples per code at 16 kHz: 2 mel frames of 160
_MEL_BINS = 80
_FRAME_LENGTH = 400  # 25 ms
_FRAME_SHIFT = 160  # 10 ms
_FFT = 512  # the frame length rounded up to a power of two
_STACK = 2  # mel frames per semantic frame
_EPSILON = torch.finfo(torch.float32).eps


def _mel(freq: torch.Tensor | float) -> torch.Tensor | float:
    if isinstance(freq, torch.Tensor):
        return 1127.0 * (1.0 + freq / 700.0).log()
    return 1127.0 * math.log(1.0 + freq / 700.0)


def mel_banks(low_freq: float = 20.0, high_freq: float = SAMPLE_RATE / 2) -> torch.Tensor:
    """Kaldi's triangular mel filters: float32 [80, 257] over the bins of a 512-point rFFT at 16 kHz."""
    mel_low, mel_high = _mel(low_freq), _mel(high_freq)
    delta = (mel_high - mel_low) / (_MEL_BINS + 1)
    index = torch.arange(_MEL_BINS).unsqueeze(1)
    left = mel_low + index * delta
    center = mel_low + (index + 1.0) * delta
    right = mel_low + (index + 2.0) * delta
    mel = _mel(SAMPLE_RATE / _FFT * torch.arange(_FFT / 2)).unsqueeze(0)
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    banks = torch.max(torch.zeros(1), torch.min(up, down))
    return torch.nn.functional.pad(banks, (0, 1))  # Nyquist bin: no filter reaches it


def kaldi_fbank(wav: torch.Tensor) -> torch.Tensor:
    """float32 [n] (n >= 400) -> log-mel frames float32 [1 + (n - 400) // 160, 80], as
    ``torchaudio.compliance.kaldi.fbank`` with the extractors' options."""
    if wav.numel() < _FRAME_LENGTH:
        raise ValueError(f"kaldi_fbank needs at least {_FRAME_LENGTH} samples, got {wav.numel()}")
    frames = 1 + (wav.numel() - _FRAME_LENGTH) // _FRAME_SHIFT
    strided = wav.contiguous().as_strided((frames, _FRAME_LENGTH), (_FRAME_SHIFT, 1))
    strided = strided - strided.mean(dim=1, keepdim=True)
    previous = torch.nn.functional.pad(strided.unsqueeze(0), (1, 0), mode="replicate").squeeze(0)
    strided = strided - 0.97 * previous[:, :-1]
    window = torch.hann_window(_FRAME_LENGTH, periodic=False, dtype=wav.dtype).pow(0.85)  # "povey"
    strided = torch.nn.functional.pad(strided * window, (0, _FFT - _FRAME_LENGTH))
    power = torch.fft.rfft(strided).abs().pow(2.0)
    energies = torch.mm(power, mel_banks().to(wav.dtype).T)
    return torch.max(energies, torch.tensor(_EPSILON, dtype=wav.dtype)).log()


def acoustic_input(wav: np.ndarray) -> torch.Tensor:
    """float32 [N] -> float32 [1, 1, L]: one zero appended, zero-padded to a multiple of the hop (L above)."""
    length = HOP * -(-(wav.size + 1) // HOP)
    x = torch.zeros(1, 1, length)
    x[0, 0, : wav.size] = torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32))
    return x


def semantic_input(acoustic: torch.Tensor, centered: bool) -> torch.Tensor:
    """:func:`acoustic_input`'s [1, 1, L] -> stacked normalised log-mels float32 [1, L / 320 - (not centered), 160].

    ``centered``: XCodec2's extractor (160 zeros on each side first); NeuCodec's is not."""
    wav = acoustic.reshape(-1)
    if centered:
        wav = torch.nn.functional.pad(wav, (HOP // 2, HOP // 2))
    feats = kaldi_fbank(wav * 2**15)
    feats = (feats - feats.mean(0)) / torch.sqrt(feats.var(0, unbiased=True) + 1e-7)
    if feats.shape[0] % _STACK:  # never for the L above (2 L / 320 or 2 L / 320 - 2 frames); the extractors pad with 1
        feats = torch.cat([feats, torch.ones(_STACK - feats.shape[0] % _STACK, _MEL_BINS)])
    return feats.reshape(1, feats.shape[0] // _STACK, _MEL_BINS * _STACK)
