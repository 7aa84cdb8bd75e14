"""The backward outside autocast's weight cache (issue 34 item 4): the peak of live tensors of one micro-batch's
forward and backward with fp32 weights under bf16 autocast and gradient checkpointing: autocast's weight cache on
and the backward inside its region (as train_step ran it before), and as ``train_step``'s ``micro_step`` runs it
now (no cache, the backward outside), side by side in one process from the same seed, with the gradients compared
bit for bit. Last line: ratio = peak now / peak before.

    .venv/bin/python bench/autocast_cache.py [--hidden 1024] [--layers 4] [--tokens 512]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests.helpers: the live-tensor tracker

from tests.helpers.peak import Peak, _batch  # noqa: E402
from voxrelay.config import load_config  # noqa: E402
from voxrelay.models.base import pop_counts  # noqa: E402


def main() -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import AutocastKwargs

    from voxrelay.models.registry import as_trained, build_model
    from voxrelay.plan.model import data_spec
    from voxrelay.train.build import bare_run
    from voxrelay.train.loop import micro_step
    from voxrelay.train.state import seed_everything

    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=512)
    a = ap.parse_args()
    cfg = load_config(None, [f"model.hidden_size={a.hidden}", f"model.num_heads={a.hidden // 64}",
                             f"model.intermediate_size={3 * a.hidden}", f"model.num_layers={a.layers}",
                             "model.dropout=0.0", "model.frames_per_position=null", "model.text_position_scale=null",
                             "model.audio_embedding=free", "train.precision=bf16", "train.gradient_checkpointing=true"])
    batch, peaks, grads = None, {}, {}
    for before in (True, False):
        seed_everything(0)
        model = build_model(as_trained(cfg.model, cfg.train), data_spec(cfg, None), 0)
        handlers = [AutocastKwargs(cache_enabled=True)] if before else []  # else what train's build sets: no cache
        AcceleratorState._reset_state()
        run = bare_run(model, cfg, Accelerator(mixed_precision="bf16", cpu=True, kwargs_handlers=handlers))
        if batch is None:
            batch = _batch(model, "codec_lm", a.tokens)
            batch.pop("audio_seconds", None)
            pop_counts(batch)
        peak = Peak()
        peak.adopt([*run.module.parameters(), *run.module.buffers(), *batch.values()])
        # (an outer region, even a disabled one, would keep the cache: it is cleared when the outermost one ends)
        with peak, (run.accelerator.autocast() if before else contextlib.nullcontext()):
            micro_step(run, dict(batch), {"ce": 1.0}, True)
        peaks[before] = peak.peak
        grads[before] = [p.grad.clone() for p in run.module.parameters() if p.grad is not None]
    same = all(torch.equal(x, y) for x, y in zip(grads[True], grads[False], strict=True))
    print(f"cache on, backward inside autocast (before): peak {peaks[True] / 1e6:.1f} MB")
    less = (peaks[True] - peaks[False]) / 1e6
    print(f"no cache, backward outside (now):         peak {peaks[False] / 1e6:.1f} MB ({less:.1f} MB less); "
          f"gradients equal bit for bit: {same}")
    print(f"ratio {peaks[False] / peaks[True]:.3f}")


if __name__ == "__main__":
    main()
