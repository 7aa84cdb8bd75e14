"""``train.precision: auto``: the mixed precision a run trains in, from what its card can do (issue 34 item 6).

- bf16 on a card with native bf16 (compute capability 8.0 and up: A100, A10G, L4, L40S, RTX 3090/4090, H100);
- fp16 with accelerate's GradScaler on a CUDA card without it (T4, V100): the scaler skips a step whose gradients
  overflowed and lowers its scale (``train.loop`` counts those as ``scaler_skips``, not as bad steps);
- fp32 (``no``) on CPU, where autocast would only slow the step down;
- under ``train.strategy=fsdp`` on a card without bf16: fp32, because FSDP has no fp16 loss scaler over sharded
  gradients (``train.precision=fp16`` is refused there), said in the log.

The resolved value replaces ``auto`` in the run's config before anything records it, so the config snapshot and
every checkpoint name the precision the run trained in. A resumed run keeps that recorded precision whatever card
it lands on (a change of precision mid-run changes its numerics; a bf16 run on a card that only emulates bf16
is slow, and the log says so); set ``train.precision`` explicitly in a new run to choose otherwise. A run saved
before ``auto`` existed recorded ``no`` (the old default) and keeps training in fp32.

Torch-free at import: ``voxrelay plan`` resolves precisions for cards it names without a GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

AUTO = "auto"


@dataclass(frozen=True)
class Capability:
    """What the precision depends on: a CUDA card (``name``, None without CUDA) and whether it computes in
    bf16 natively (``bf16``: not emulated)."""

    name: str | None
    bf16: bool

    @property
    def cuda(self) -> bool:
        return self.name is not None


CPU = Capability(None, False)


def this_card() -> Capability:
    """This process's card: CUDA's current device, or :data:`CPU`."""
    import torch

    if not torch.cuda.is_available():
        return CPU
    # emulated bf16 (T4, V100 under recent torch) runs, but several times slower than fp16 with a scaler
    return Capability(torch.cuda.get_device_name(), bool(torch.cuda.is_bf16_supported(including_emulation=False)))


def resolve(requested: str, strategy: str, card: Capability) -> tuple[str, str]:
    """(precision, why) for ``requested`` (``auto`` or a concrete ``no``/``bf16``/``fp16``) under ``strategy``
    on ``card``; a concrete request is returned as it is."""
    if requested != AUTO:
        return requested, f"train.precision={requested} as configured"
    if not card.cuda:
        return "no", "train.precision=auto: fp32 on CPU (no mixed precision)"
    if card.bf16:
        return "bf16", f"train.precision=auto: bf16 on {card.name} (native bf16)"
    if strategy == "fsdp":
        return "no", (f"train.precision=auto: fp32 on {card.name} under train.strategy=fsdp: this card has no bf16, "
                      "and FSDP has no fp16 loss scaler over sharded gradients (set train.strategy=ddp to train in "
                      "fp16 with a loss scaler, or use a card with bf16 to halve FSDP's memory)")
    return "fp16", (f"train.precision=auto: fp16 with a loss scaler on {card.name} (no native bf16; steps whose "
                    "gradients overflow are skipped and the scale lowered)")


def recorded(run_config: dict[str, Any] | None) -> str | None:
    """The precision a run's saved config (its snapshot or a checkpoint's, as a dict) trained in; None when
    there is none or it says ``auto`` (never written by this version). A config without the key is from before
    ``train.precision`` could be ``auto``: what ``TrainConfig.CHANGED_DEFAULTS`` says runs had then (``no``)."""
    from voxrelay.config import TrainConfig

    if not isinstance(run_config, dict):
        return None
    train = run_config.get("train")
    if not isinstance(train, dict):
        return None
    value = train.get("precision", TrainConfig.CHANGED_DEFAULTS["precision"])
    value = "no" if value is False else value  # YAML's bare `no`
    return value if value in ("no", "bf16", "fp16") else None


def run_precision(requested: str, strategy: str, card: Capability, saved: str | None) -> tuple[str, str]:
    """(precision, why) of a run: ``auto`` resumes in the precision the run recorded (``saved``), else resolves
    for ``card``. A recorded bf16 on a card without native bf16 is kept, with a warning in ``why``."""
    if requested != AUTO or saved is None:
        return resolve(requested, strategy, card)
    shown = "fp32 (no)" if saved == "no" else saved
    why = f"train.precision=auto: {shown}, the precision this run recorded when it started (kept on resume)"
    if saved == "bf16" and card.cuda and not card.bf16:
        why += (f"; {card.name} has no native bf16: torch emulates it, several times slower. To train in fp16 here, "
                "start a new run with train.precision=fp16")
    elif saved in ("bf16", "fp16") and not card.cuda:
        why += "; on CPU autocast runs slowly"
    return saved, why


def saved_config(run_uri: str) -> dict[str, Any] | None:
    """The run's config snapshot (written at every session's start, resolved precision included), or None when
    the run has none yet or it does not parse (the resume check against the checkpoint's own config still runs)."""
    import yaml

    from voxrelay import storage
    from voxrelay.paths import CONFIG_SNAPSHOT

    path = storage.join(run_uri, CONFIG_SNAPSHOT)
    try:
        if not storage.exists(path):
            return None
        data = yaml.safe_load(storage.read_text(path))
    except (OSError, yaml.YAMLError) as e:
        log.warning("could not read %s for the precision this run recorded (%s); resolving train.precision=auto "
                    "for this card", path, e)
        return None
    return data if isinstance(data, dict) else None


def settle(cfg, fresh: bool, card: Capability | None = None, say: bool = True):
    """``cfg`` with ``train.precision`` resolved (see the module's docstring): what the Accelerator gets and what
    the run records. ``fresh``: the run starts over, so what it recorded before does not count."""
    tc = cfg.train
    saved = None if fresh or tc.precision != AUTO else recorded(saved_config(cfg.run_uri))
    card = card or this_card()
    precision, why = run_precision(tc.precision, tc.strategy, card, saved)
    if tc.precision == AUTO and say:  # a warning where the card's fast path is not taken
        slow = card.cuda and (precision == "no" or (precision == "bf16" and not card.bf16))
        (log.warning if slow else log.info)(why)
    cfg.train = tc.model_copy(update={"precision": precision})
    return cfg


def compute_as_trained(module, precision: str) -> None:
    """``module``'s forward under the autocast training ran it in (``train.precision`` bf16/fp16, its outputs
    back in float32), as accelerate's ``prepare`` wraps it; fp32 (``no``) unchanged."""
    import torch
    from accelerate.utils import convert_outputs_to_fp32

    if precision not in ("bf16", "fp16"):
        return
    device = next(module.parameters()).device.type
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    module.forward = convert_outputs_to_fp32(torch.autocast(device, dtype=dtype, cache_enabled=False)(module.forward))
