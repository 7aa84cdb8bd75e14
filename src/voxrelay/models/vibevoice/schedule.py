"""VibeVoice's noise schedule without diffusers: 1000 steps of the "squaredcos_cap_v2" (cosine) schedule,
v-prediction. Training draws timesteps over the whole schedule and noises latents with :meth:`add_noise`;
synthesis denoises with DPM-Solver++ (2nd order multistep, the sampler the released checkpoints name), through
the ``set_timesteps`` / ``timesteps`` / ``step`` interface transformers' VibeVoice generation calls.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

TRAIN_STEPS = 1000


def _alphas_cumprod(steps: int) -> torch.Tensor:
    """diffusers' betas_for_alpha_bar(cosine), max beta 0.999, as float64 cumulative products."""
    def alpha_bar(t: float) -> float:
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    betas = torch.tensor([min(1 - alpha_bar((i + 1) / steps) / alpha_bar(i / steps), 0.999) for i in range(steps)],
                         dtype=torch.float64)
    return torch.cumprod(1.0 - betas, dim=0)


class CosineVSchedule:
    """``alpha_t`` / ``sigma_t`` (float32 [1000]): x_t = alpha_t x_0 + sigma_t noise; the model predicts
    v = alpha_t noise - sigma_t x_0."""

    def __init__(self, steps: int = TRAIN_STEPS):
        cumprod = _alphas_cumprod(steps)
        self.num_train_timesteps = steps
        self.alpha_t = cumprod.sqrt().float()
        self.sigma_t = (1 - cumprod).sqrt().float()
        self.timesteps = torch.arange(steps - 1, -1, -1)
        self._model_outputs: list[torch.Tensor] = []
        self._last: int | None = None

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        a = self.alpha_t.to(x0.device, x0.dtype)[timesteps].unsqueeze(-1)
        s = self.sigma_t.to(x0.device, x0.dtype)[timesteps].unsqueeze(-1)
        return a * x0 + s * noise

    def v_target(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        a = self.alpha_t.to(x0.device, x0.dtype)[timesteps].unsqueeze(-1)
        s = self.sigma_t.to(x0.device, x0.dtype)[timesteps].unsqueeze(-1)
        return a * noise - s * x0

    # --- sampling (DPM-Solver++ 2M, "linspace" spacing, first order at the last step down to sigma 0) ---
    def set_timesteps(self, num_inference_steps: int, device: torch.device | str | None = None) -> None:
        steps = torch.linspace(0, self.num_train_timesteps - 1, num_inference_steps + 1).round()
        self.timesteps = steps.flip(0)[:-1].to(torch.int64)
        self._model_outputs, self._last = [], None

    def _lambda(self, t: int | None) -> tuple[float, float, float]:
        if t is None:  # the end of sampling: sigma 0
            return 1.0, 0.0, math.inf
        a, s = float(self.alpha_t[t]), float(self.sigma_t[t])
        return a, s, math.log(a) - math.log(s)

    def step(self, model_output: torch.Tensor, timestep: torch.Tensor | int, sample: torch.Tensor):
        t = int(timestep)
        index = int((self.timesteps == t).nonzero()[0])
        prev = int(self.timesteps[index + 1]) if index + 1 < len(self.timesteps) else None
        a_s, s_s, lam_s = self._lambda(t)
        x0 = (a_s * sample.double() - s_s * model_output.double())  # v -> x_0
        a_t, s_t, lam_t = self._lambda(prev)
        if prev is None:
            out = x0  # to sigma 0: the data prediction itself
        else:
            h = lam_t - lam_s
            d = x0
            if self._model_outputs and self._last is not None:  # second order with the previous x_0
                h_prev = lam_s - self._lambda(self._last)[2]
                r = h_prev / h
                d = (1 + 1 / (2 * r)) * x0 - (1 / (2 * r)) * self._model_outputs[-1]
            out = (s_t / s_s) * sample.double() - a_t * math.expm1(-h) * d
        self._model_outputs = [x0]
        self._last = t
        return SimpleNamespace(prev_sample=out.to(sample.dtype))
