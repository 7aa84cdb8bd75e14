"""EMA of the diffusion head: ``ema = decay * ema + (1 - decay) * weight`` after every applied optimizer step,
saved in every checkpoint (the family's extra state), swapped in for evaluation, synthesis and export.

Tensors are kept whole and keyed by their name from ``diffusion_head`` on (peft's ``modules_to_save.default.``
left out), so the same state fits the model with or without LoRA, before or after merging. Under FSDP2 a
sharded weight is gathered for the update (every process keeps the same whole EMA) and scattered back when
swapped in.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from voxrelay.models.seam import FamilyModelBase

HEAD = "diffusion_head."
PEFT_COPY = "modules_to_save.default."
PEFT_ORIGINAL = "original_module."


def head_key(name: str) -> str | None:
    """``x.diffusion_head.layers.0.linear.weight`` -> ``diffusion_head.layers.0.linear.weight`` (None: not the head)."""
    at = name.find(HEAD)
    return None if at < 0 or PEFT_ORIGINAL in name else name[at:].replace(PEFT_COPY, "")


def _whole(p: torch.Tensor) -> torch.Tensor:
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def _assign(p: torch.Tensor, value: torch.Tensor) -> None:
    if hasattr(p, "device_mesh"):  # a DTensor: scatter the whole value as the parameter is laid out
        from torch.distributed.tensor import distribute_tensor

        value = distribute_tensor(value.to(p.device, p.dtype), p.device_mesh, p.placements)
    p.data.copy_(value)


class DiffusionEma(FamilyModelBase):
    """The EMA part of :class:`~voxrelay.models.vibevoice.model.VibeVoice` (``self.module`` is set by it)."""

    module: torch.nn.Module

    def __init__(self, decay: float | None) -> None:
        self.ema_decay = decay
        self.ema: dict[str, torch.Tensor] = {}
        self._swapped = False

    def _head(self, trainable: bool) -> dict[str, torch.Tensor]:
        found = {}
        for name, p in self.module.named_parameters():
            key = head_key(name)
            if key is not None and (p.requires_grad or not trainable):
                found[key] = p
        return found

    def after_optimizer_step(self) -> None:
        if self.ema_decay is None:
            return
        with torch.no_grad():
            for key, p in self._head(trainable=True).items():
                value = _whole(p.detach()).float()
                if key not in self.ema:
                    self.ema[key] = value.clone()
                else:
                    self.ema[key].mul_(self.ema_decay).add_(value.to(self.ema[key].device), alpha=1 - self.ema_decay)

    def extra_state(self) -> dict[str, torch.Tensor]:
        return {f"ema.{key}": t.detach().cpu() for key, t in self.ema.items()}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        unknown = [k for k in state if not k.startswith("ema.")]
        if unknown:
            raise ValueError(f"the checkpoint's family state holds {unknown[:3]}, which this model does not keep")
        self.ema = {k[len("ema."):]: t.float().clone() for k, t in state.items()}

    @contextmanager
    def eval_weights(self) -> Iterator[None]:
        """The diffusion head holds the EMA weights inside (re-entrant; nothing changes without an EMA)."""
        if not self.ema or self._swapped:
            yield
            return
        params = self._head(trainable=False)
        missing = sorted(set(self.ema) - set(params))
        if missing:
            raise ValueError(f"the EMA holds {missing[:3]}, which the diffusion head lacks")
        saved = {key: params[key].detach().clone() for key in self.ema}
        self._swapped = True
        try:
            with torch.no_grad():
                for key, value in self.ema.items():
                    _assign(params[key], value)
            yield
        finally:
            with torch.no_grad():
                for key, value in saved.items():
                    params[key].data.copy_(value)
            self._swapped = False
