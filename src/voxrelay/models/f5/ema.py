"""F5-TTS' EMA of the weights, on upstream's schedule (ema_pytorch 0.8.3 as f5-tts' trainer builds it): one update
per optimizer step; the first copies the weights; then every 10th, a copy while the step is at most 100, after that
``ema += (1 - decay) (w - ema)`` with ``decay = 1 - (1 + step - 100)^(-2/3)`` up to 0.9999. Kept whole in float32 by
parameter name, saved in every checkpoint with its step (the family's extra state), swapped in for evaluation,
synthesis and export."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

BETA, AFTER, EVERY, POWER = 0.9999, 100, 10, 2 / 3
STEP = "ema_step"


def decay_at(step: int) -> float:
    """The decay of the update made at ``step`` (0 for a copy)."""
    epoch = step + 1 - AFTER - 1
    return 0.0 if epoch <= 0 else min(1 - (1 + epoch) ** -POWER, BETA)


class WeightsEma:
    """The EMA of ``module`` 's trainable parameters (``enabled`` False: nothing is kept)."""

    def __init__(self, module: torch.nn.Module, enabled: bool) -> None:
        self.module = module
        self.enabled = enabled
        self.weights: dict[str, torch.Tensor] = {}
        self.step = 0
        self._swapped = False

    def _params(self) -> dict[str, torch.nn.Parameter]:
        return {name: p for name, p in self.module.named_parameters() if p.requires_grad}

    @torch.no_grad()
    def update(self) -> None:
        if not self.enabled:
            return
        step, self.step = self.step, self.step + 1
        params = self._params()
        if not self.weights or (step % EVERY == 0 and step <= AFTER):
            self.weights = {name: p.detach().float().clone() for name, p in params.items()}
        elif step % EVERY == 0:
            keep = decay_at(step)
            for name, p in params.items():
                self.weights[name].lerp_(p.detach().float().to(self.weights[name].device), 1 - keep)

    def state(self) -> dict[str, torch.Tensor]:
        if not self.weights:
            return {}
        return {f"ema.{k}": v.cpu() for k, v in self.weights.items()} | {STEP: torch.tensor(self.step)}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        unknown = [k for k in state if not k.startswith("ema.") and k != STEP]
        if unknown:
            raise ValueError(f"the checkpoint's family state holds {unknown[:3]}, which this model does not keep")
        self.weights = {k[len("ema."):]: v.float().clone() for k, v in state.items() if k.startswith("ema.")}
        self.step = int(state[STEP]) if STEP in state else 0

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The module holds the EMA weights inside (re-entrant; nothing changes without an EMA)."""
        if not self.weights or self._swapped:
            yield
            return
        params = self._params()
        saved = {name: params[name].detach().clone() for name in self.weights}
        self._swapped = True
        try:
            with torch.no_grad():
                for name, value in self.weights.items():
                    params[name].copy_(value.to(params[name].device, params[name].dtype))
            yield
        finally:
            with torch.no_grad():
                for name, value in saved.items():
                    params[name].copy_(value)
            self._swapped = False
