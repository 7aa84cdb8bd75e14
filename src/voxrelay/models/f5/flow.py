"""F5-TTS's conditional flow matching around its :class:`~voxrelay.models.f5.dit.DiT`, in plain torch: the log-mel
spectrogram it learns (Vocos' 24 kHz, 100 bins, hop 256), the training loss with the infilling mask, and the
sway-sampled Euler ODE of synthesis with classifier-free guidance; each equal to f5-tts 1.1.22's on the same inputs
(``tests/unit/models/test_f5_dit.py``).

Upstream draws the loss' randomness from the global torch RNG and Python's ``random``; here every draw comes from a
``torch.Generator`` the caller owns (a family generator, saved with the run), in upstream's order, so a resumed run
draws what a straight run would: :func:`draw` then :func:`loss_terms`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

SAMPLE_RATE, N_FFT, HOP, N_MELS = 24000, 1024, 256, 100
FRAC_LENGTHS = (0.7, 1.0)  # the infilled span: 70-100% of a sample's frames
AUDIO_DROP, COND_DROP = 0.3, 0.2  # classifier-free guidance dropout: the audio alone, both audio and text


def mel_filters(rate: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS) -> torch.Tensor:
    """[n_fft / 2 + 1, n_mels]: HTK-scale triangles from 0 to Nyquist, unnormalised (torchaudio's defaults)."""
    freqs = torch.linspace(0, rate // 2, n_fft // 2 + 1)
    to_mel = 2595.0 * math.log10(1.0 + (rate // 2) / 700.0)
    edges = 700.0 * (10.0 ** (torch.linspace(0.0, to_mel, n_mels + 2) / 2595.0) - 1.0)
    widths = edges[1:] - edges[:-1]
    slopes = edges[None] - freqs[:, None]
    rising, falling = -slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]
    return torch.clamp(torch.min(rising, falling), min=0.0)


def log_mel(wav: torch.Tensor) -> torch.Tensor:
    """[B, T] float at 24 kHz -> natural-log magnitude mel [B, 100, T // 256 + 1] (floor 1e-5)."""
    spec = torch.stft(wav, N_FFT, hop_length=HOP, win_length=N_FFT, window=torch.hann_window(N_FFT, device=wav.device),
                      center=True, pad_mode="reflect", normalized=False, onesided=True, return_complex=True).abs()
    mel = torch.matmul(spec.transpose(-1, -2), mel_filters().to(spec.device)).transpose(-1, -2)
    return mel.clamp(min=1e-5).log()


class Draws(NamedTuple):
    """The randomness of one loss: the span's length share and start, the noise, the time, the two dropouts."""

    frac: torch.Tensor  # [B] in [0.7, 1)
    start: torch.Tensor  # [B] in [0, 1)
    noise: torch.Tensor  # [B, N, D]
    time: torch.Tensor  # [B]
    drop_audio: bool
    drop_text: bool


def draw(generator: torch.Generator, batch: int, frames: int, channels: int) -> Draws:
    """Upstream's draws in its order (span length, span start, noise, time, then two uniforms for the dropouts),
    from ``generator`` (CPU)."""
    frac = torch.empty(batch).uniform_(*FRAC_LENGTHS, generator=generator)
    start = torch.rand(batch, generator=generator)
    noise = torch.randn(batch, frames, channels, generator=generator)
    time = torch.rand(batch, generator=generator)
    audio, both = torch.rand(2, generator=generator).tolist()
    return Draws(frac, start, noise, time, audio < AUDIO_DROP or both < COND_DROP, both < COND_DROP)


def span_mask(lens: torch.Tensor, frac: torch.Tensor, start: torch.Tensor, frames: int) -> torch.Tensor:
    """bool [B, N]: one contiguous span of ``frac`` of each sample's ``lens`` frames, starting at ``start`` of the
    room left."""
    length = (frac * lens).long()
    first = ((lens - length) * start).long().clamp(min=0)
    pos = torch.arange(frames, device=lens.device)[None]
    real = pos < lens[:, None]
    return (pos >= first[:, None]) & (pos < (first + length)[:, None]) & real


def loss_terms(dit: torch.nn.Module, mel: torch.Tensor, text: torch.Tensor, lens: torch.Tensor,
               d: Draws) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, count) of the squared error of the predicted flow over the infilled span's (frame, channel) elements:
    ``mel`` [B, N, D] zero-padded, ``text`` [B, Nt] (-1 padding), ``lens`` [B] frames; upstream's loss is sum/count."""
    frames = mel.shape[1]
    mask = torch.arange(frames, device=mel.device)[None] < lens[:, None]
    span = span_mask(lens, d.frac.to(mel.device), d.start.to(mel.device), frames)
    noise, t = d.noise.to(mel), d.time.to(mel)
    x_t = (1 - t[:, None, None]) * noise + t[:, None, None] * mel
    cond = torch.where(span[..., None], torch.zeros_like(mel), mel)
    pred = dit(x=x_t, cond=cond, text=text, time=t, mask=mask, drop_audio_cond=d.drop_audio, drop_text=d.drop_text)
    err = F.mse_loss(pred.float(), (mel - noise).float(), reduction="none")[span]
    return err.sum(), torch.tensor(err.numel(), device=mel.device)


def time_grid(steps: int, sway: float | None, device=None) -> torch.Tensor:
    """[steps + 1] from 0 to 1, bent by sway sampling (``t + sway * (cos(pi t / 2) - 1 + t)``: negative sway spends
    more steps early)."""
    t = torch.linspace(0, 1, steps + 1, device=device)
    return t if sway is None else t + sway * (torch.cos(torch.pi / 2 * t) - 1 + t)


@torch.no_grad()
def sample(dit: torch.nn.Module, prompt: torch.Tensor, text: torch.Tensor, duration: int, steps: int = 32,
           cfg: float = 2.0, sway: float | None = -1.0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Mel [1, duration, D] infilled after ``prompt`` [1, P, D] for ``text`` [1, Nt] (prompt + new text), and the
    trajectory [steps + 1, 1, duration, D]: Euler steps on the sway grid of the flow ``v = pred + cfg (pred -
    pred_unconditioned)`` from seeded noise; the prompt's frames kept as given."""
    p = prompt.shape[1]
    duration = max(duration, int((text != -1).sum()) + 1, p + 1)
    cond = F.pad(prompt, (0, 0, 0, duration - p))
    known = (torch.arange(duration, device=prompt.device) < p)[None, :, None]
    cond = torch.where(known, cond, torch.zeros_like(cond))
    generator = torch.Generator(device=prompt.device).manual_seed(seed)
    y = torch.randn(duration, prompt.shape[2], generator=generator, device=prompt.device, dtype=prompt.dtype)[None]
    grid = time_grid(steps, sway, prompt.device).to(prompt.dtype)
    path = [y]
    for k in range(steps):
        t = grid[k]
        if cfg < 1e-5:
            v = dit(x=y, cond=cond, text=text, time=t)
        else:
            pred, null = torch.chunk(dit(x=y, cond=cond, text=text, time=t, cfg_infer=True), 2, dim=0)
            v = pred + (pred - null) * cfg
        y = y + (grid[k + 1] - t) * v
        path.append(y)
    return torch.where(known, cond, y), torch.stack(path)
