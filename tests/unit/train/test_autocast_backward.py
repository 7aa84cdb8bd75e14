"""The backward runs outside autocast's weight cache (issue 34 item 4): autocast keeps a bf16 copy of every
trainable fp32 weight for as long as its region lasts, so a backward inside the region held them all to its end;
and the forward runs without that cache, which held them all at the loss even under checkpointing.
Measured with the live-tensor tracker on a small model (fp32 weights, bf16 autocast, gradient checkpointing);
the gradients are the same bits either way."""

from __future__ import annotations

import torch

from tests.helpers.peak import Peak, _batch
from voxrelay.config import load_config
from voxrelay.models.base import pop_counts

LAYERS = 3
OVERRIDES = ["model.hidden_size=384", "model.num_heads=6", "model.intermediate_size=1152",
             f"model.num_layers={LAYERS}", "model.dropout=0.0", "model.frames_per_position=null",
             "model.text_position_scale=null", "model.audio_embedding=free", "train.precision=bf16",
             "train.gradient_checkpointing=true", "train.max_steps=10"]


def _run(cache: bool):
    """A run as ``train_step`` trains it, or (``cache``) with autocast's weight cache on, as it did before."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import AutocastKwargs

    from voxrelay.models.registry import build_model
    from voxrelay.plan.model import data_spec
    from voxrelay.train.build import bare_run
    from voxrelay.train.state import seed_everything

    cfg = load_config(None, OVERRIDES)
    AcceleratorState._reset_state()
    seed_everything(0)
    model = build_model(cfg.model, data_spec(cfg, None), 0)
    handlers = [AutocastKwargs(cache_enabled=True)] if cache else []
    return bare_run(model, cfg, Accelerator(mixed_precision="bf16", cpu=True, kwargs_handlers=handlers)), model


def _peak_and_grads(run, batch, inside: bool) -> tuple[int, list[torch.Tensor]]:
    """Peak of live tensors over one micro-batch's forward and backward, the backward inside an autocast region
    (as ``train_step`` did before) or as ``train_step`` runs it now."""
    from voxrelay.train.loop import micro_step

    run.optimizer.zero_grad(set_to_none=True)
    peak = Peak()
    peak.adopt([*run.module.parameters(), *run.module.buffers(), *batch.values()])
    with peak:
        if inside:
            with run.accelerator.autocast():
                micro_step(run, dict(batch), {"ce": 1.0}, True)
        else:
            micro_step(run, dict(batch), {"ce": 1.0}, True)
    return peak.peak, [p.grad.clone() for p in run.module.parameters() if p.grad is not None]


def test_the_backward_runs_outside_autocasts_cache_and_frees_its_weight_copies() -> None:
    from accelerate.state import AcceleratorState

    try:
        old, model = _run(cache=True)
        batch = _batch(model, "codec_lm", 160)
        batch.pop("audio_seconds", None)
        pop_counts(batch)
        inside, grads_inside = _peak_and_grads(old, batch, inside=True)
        run, model = _run(cache=False)
        outside, grads_outside = _peak_and_grads(run, batch, inside=False)
        assert run.accelerator.autocast_handler.cache_enabled is False  # what train's own build sets
        layers = [m for m in run.module.modules() if isinstance(m, model.fsdp_layer_classes())]
        copies = sum(2 * m.weight.numel() for layer in layers for m in layer.modules()
                     if isinstance(m, torch.nn.Linear) and m.weight.requires_grad)
    finally:
        AcceleratorState._reset_state()
    # the layers' copies the cache held are gone (bf16, 2 bytes per weight; measured: 12.5 MB less, copies 11.5)
    assert inside - outside >= 0.9 * copies, (inside, outside, copies)
    # the same gradients, bit for bit
    assert len(grads_inside) == len(grads_outside) > 0
    assert all(torch.equal(a, b) for a, b in zip(grads_inside, grads_outside, strict=True))
