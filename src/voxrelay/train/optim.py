"""The optimizer (``train.optimizer``) and the learning-rate schedule (``train.schedule``) of a run.

Both are built from :class:`~voxrelay.config.TrainConfig` and the parameter groups a family gives
(:meth:`FamilyModel.param_groups`: matrices decayed, norms/biases/1-d parameters at weight_decay 0);
every optimizer keeps those per-group weight decays. Their ``state_dict()`` go into the checkpoint.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from voxrelay.config import ConfigError, TrainConfig

log = logging.getLogger(__name__)

Groups = list[dict[str, Any]]


def _adamw(tc: TrainConfig, groups: Groups) -> torch.optim.Optimizer:
    # on a GPU (parameters there, not offloaded) the fused kernel: one launch for every tensor's update, as a
    # HF Trainer's default optim="adamw_torch_fused"; on a CPU the default implementation (the demo's numbers)
    fused = torch.cuda.is_available() and not tc.cpu_offload
    return torch.optim.AdamW(groups, lr=tc.lr, betas=tc.betas, eps=tc.eps, weight_decay=tc.weight_decay,
                             fused=fused or None)


def _bitsandbytes(name: str = "adamw_8bit"):
    """bitsandbytes, imported only when asked for (it is the optional extra ``voxrelay[bnb]``)."""
    try:
        import bitsandbytes
    except ImportError as e:
        raise ConfigError(
            f"train.optimizer={name} needs bitsandbytes ({e}): pip install 'voxrelay[bnb]', "
            f"or set train.optimizer={name.removesuffix('_8bit')}"
        ) from None
    return bitsandbytes


def _adamw_8bit(tc: TrainConfig, groups: Groups) -> torch.optim.Optimizer:
    # tensors under bitsandbytes' min_8bit_size (4096 elements) keep 32-bit states: small ones cost little
    return _bitsandbytes().optim.AdamW8bit(
        groups, lr=tc.lr, betas=tc.betas, eps=tc.eps, weight_decay=tc.weight_decay
    )


def _lion(tc: TrainConfig, groups: Groups) -> torch.optim.Optimizer:
    from voxrelay.train.lion import Lion

    return Lion(groups, lr=tc.lr, betas=tc.betas, weight_decay=tc.weight_decay)


def _lion_8bit(tc: TrainConfig, groups: Groups) -> torch.optim.Optimizer:
    return _bitsandbytes("lion_8bit").optim.Lion8bit(groups, lr=tc.lr, betas=tc.betas, weight_decay=tc.weight_decay)


def _adafactor(tc: TrainConfig, groups: Groups) -> torch.optim.Optimizer:
    from transformers.optimization import Adafactor

    # as HF Trainer's optim="adafactor": our lr and schedule (not Adafactor's relative step, not
    # scaled by the parameter's RMS); beta1=None keeps no first moment (the memory saving), and
    # Adafactor's own eps pair (1e-30, 1e-3) is used: train.betas / train.eps are AdamW's
    return Adafactor(groups, lr=tc.lr, weight_decay=tc.weight_decay, beta1=None,
                     relative_step=False, scale_parameter=False, warmup_init=False)


# train.optimizer -> builder; a test keeps these keys equal to the config's Literal
OPTIMIZERS: dict[str, Callable[[TrainConfig, Groups], torch.optim.Optimizer]] = {
    "adamw": _adamw, "adamw_8bit": _adamw_8bit, "lion": _lion, "lion_8bit": _lion_8bit, "adafactor": _adafactor,
}


def check_available(tc: TrainConfig) -> None:
    """Raise ConfigError now (before data and weights are loaded) if the optimizer's package is missing."""
    if tc.optimizer.endswith("_8bit"):
        _bitsandbytes(tc.optimizer)
    if tc.lora is not None and tc.lora.base_bits:
        from voxrelay.models.qlora import require_bitsandbytes

        require_bitsandbytes(tc.lora.base_bits)


def build_optimizer(tc: TrainConfig, groups: Groups) -> torch.optim.Optimizer:
    """``tc.optimizer`` over ``groups``; a group's own ``weight_decay`` (0 for norms and biases) wins
    over ``tc.weight_decay``."""
    return OPTIMIZERS[tc.optimizer](tc, groups)


def lr_lambda(tc: TrainConfig) -> Callable[[int], float]:
    """Multiplier of ``tc.lr`` at optimizer step ``step`` (0-based), by ``tc.schedule``: equal to HF transformers'
    ``get_scheduler`` of the same name (``get_*_schedule_with_warmup``; cosine with ``min_lr_ratio`` > 0: their
    ``cosine_with_min_lr``). Warmup (all but ``constant``) is ``step / warmup_steps``, or with
    ``warmup_from_zero: false`` ``(step + 1) / (warmup_steps + 1)``. Decays (cosine, linear) end at
    ``min_lr_ratio`` at ``max_steps`` and stay there (HF's cosine would rise again past its end)."""
    warmup, floor, total = tc.warmup_steps, tc.min_lr_ratio, tc.max_steps

    def f(step: int) -> float:
        if tc.schedule == "constant":
            return 1.0
        if step < warmup:
            return float(step) / float(max(1, warmup)) if tc.warmup_from_zero else (step + 1) / (warmup + 1)
        if tc.schedule == "constant_with_warmup":
            return 1.0
        if tc.schedule == "linear":  # HF's arithmetic, term for term: equal to the last bit
            return floor + (1 - floor) * max(0.0, float(total - step) / float(max(1, total - warmup)))
        progress = min(1.0, float(step - warmup) / float(max(1, total - warmup)))
        return floor + (1 - floor) * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    return f


def started_schedule(tc: TrainConfig, saved: dict[str, Any]) -> dict[str, Any]:
    """The schedule keys a resumed run keeps from ``saved`` (the config of the checkpoint it resumes): those whose
    default changed since (``TrainConfig.CHANGED_DEFAULTS``, ``ADDED_WITH_NEW_BEHAVIOUR``) and that this session's
    config leaves unset, where the saved value differs. An older run thus goes on with the schedule it started with."""
    from voxrelay.config import with_added_defaults

    old = with_added_defaults(saved).get("train") or {}
    keys = [*TrainConfig.CHANGED_DEFAULTS, *TrainConfig.ADDED_WITH_NEW_BEHAVIOUR]
    return {k: old[k] for k in keys if k in old and k not in tc.model_fields_set and old[k] != getattr(tc, k)}


def build_scheduler(tc: TrainConfig, optimizer: torch.optim.Optimizer) -> LambdaLR:
    """The schedule of ``tc`` on ``optimizer`` (stepped once per optimizer step)."""
    if tc.schedule == "constant" and tc.warmup_steps:
        log.warning("train.schedule=constant has no warmup (as in HF transformers): train.warmup_steps=%d is "
                    "not used; set train.schedule=constant_with_warmup to warm up", tc.warmup_steps)
    return LambdaLR(optimizer, lr_lambda(tc))
