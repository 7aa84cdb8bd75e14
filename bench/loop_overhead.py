"""Overhead of voxrelay's training step vs a bare PyTorch loop, side by side in one process.

Same tiny codec_lm model (two identical copies), same batches, same AdamW + schedule + clipping.
Repeats alternate between the two loops so machine noise hits both alike; the ratio is
median(voxrelay step time) / median(bare step time). Goal: <= 1.03.

    .venv/bin/python bench/loop_overhead.py [--steps 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np
import torch
from accelerate import Accelerator

from voxrelay.config import RunConfig, load_config
from voxrelay.data.shards import EncodedUtterance
from voxrelay.models.base import DataSpec, FamilyModel
from voxrelay.models.registry import build_model
from voxrelay.train.build import Run
from voxrelay.train.loop import train_step
from voxrelay.train.optim import lr_lambda


def make_batches(model: FamilyModel, n: int, batch: int, frames: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        examples = [
            model.example(EncodedUtterance("x", "a sentence of about this many characters", None, None, 1.0,
                                           rng.integers(0, 256, (4, frames))))
            for _ in range(batch)
        ]
        out.append(model.collate(examples))
    return out


def bare_step(model: FamilyModel, module, optimizer, scheduler, batch: dict, clip: float) -> None:
    ce = model.loss(module, batch)["ce"]
    (ce.sum / ce.count).backward()
    torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def build(cfg: RunConfig, base: FamilyModel, accelerator: Accelerator | None):
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.module.parameters(), lr=cfg.train.lr, betas=(0.9, 0.95))
    module = model.module
    if accelerator is not None:
        module, opt = accelerator.prepare(module, opt)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg.train))
    return model, module, opt, sched


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--frames", type=int, default=120)
    args = ap.parse_args()
    torch.set_num_threads(2)
    cfg = load_config(None, ["train.max_steps=100000"])
    base = build_model(cfg.model, DataSpec(4, 256), seed=0)
    batches = make_batches(base, args.steps, args.batch, args.frames)
    accelerator = Accelerator(mixed_precision="no")
    m_ours, mod_ours, opt_ours, sch_ours = build(cfg, base, accelerator)
    run = Run(cfg=cfg, accelerator=accelerator, model=m_ours, module=mod_ours, optimizer=opt_ours, scheduler=sch_ours)
    m_bare, mod_bare, opt_bare, sch_bare = build(cfg, base, None)
    ours_t, bare_t = [], []
    for rep in range(args.repeats + 1):  # repeat 0 warms up both
        t0 = time.perf_counter()
        for b in batches:
            train_step(run, [dict(b, audio_seconds=1.0)])
        t_ours = (time.perf_counter() - t0) / len(batches)
        t0 = time.perf_counter()
        for b in batches:
            bare_step(m_bare, mod_bare, opt_bare, sch_bare, b, cfg.train.clip_norm)
        t_bare = (time.perf_counter() - t0) / len(batches)
        if rep:
            ours_t.append(t_ours)
            bare_t.append(t_bare)
            print(f"repeat {rep}: voxrelay {t_ours * 1000:.1f} ms/step, bare {t_bare * 1000:.1f} ms/step")
    same = all(torch.equal(a, b) for a, b in zip(mod_ours.parameters(), mod_bare.parameters(), strict=True))
    print(f"weights identical after {len(batches) * (args.repeats + 1)} steps each: {same}")
    print(f"ratio {statistics.median(ours_t) / statistics.median(bare_t):.3f}")


if __name__ == "__main__":
    main()
