"""How long a checkpoint blocks training: async save (copy the state; a thread stages it on local
disk and uploads it) vs a synchronous save + upload, for the same state on the S3 test server
(moto on 127.0.0.1); and how long a restart takes to its first step compared with a fresh start.

    .venv/bin/python bench/checkpoint_stall.py [--hidden 512] [--layers 8] [--repeats 3]
    python3 bench/checkpoint_stall.py --device cuda --local --hidden 3072 --layers 2   # a card: device->host copy

Last line: ``ratio <async blocking / sync blocking>`` (goal <= 0.05).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from voxrelay.checkpoint.manager import MODEL_FILE, STATE_FILE, CheckpointManager, model_writer, state_writer  # noqa: E402
from voxrelay.config import load_config  # noqa: E402
from voxrelay.data.shards import EncodedUtterance  # noqa: E402
from voxrelay.models.base import DataSpec  # noqa: E402
from voxrelay.models.registry import build_model  # noqa: E402


def make_state(hidden: int, layers: int, device: str = "cpu") -> tuple[dict, dict, int]:
    cfg = load_config(None, [f"model.hidden_size={hidden}", f"model.num_layers={layers}",
                             f"model.intermediate_size={hidden * 3}", "model.num_heads=8"])
    model = build_model(cfg.model, DataSpec(4, 256), seed=0)
    model.module.to(device)
    opt = torch.optim.AdamW(model.module.parameters())
    batch = model.collate([model.example(EncodedUtterance("x", "warm up", None, None, 1.0,
                                                           torch.zeros(4, 8).long().numpy()))])
    batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
    loss = model.loss(model.module, batch)["ce"].sum
    loss.backward()
    opt.step()  # creates the AdamW moments
    params = sum(p.numel() for p in model.module.parameters())
    return model.module.state_dict(), {"optimizer": opt.state_dict()}, params


def timed_saves(mgr: CheckpointManager, model_state: dict, train_state: dict, repeats: int, step0: int,
                sync: bool) -> list[float]:
    out = []
    for i in range(repeats):
        t0 = time.perf_counter()
        mgr.save(step0 + i, {MODEL_FILE: model_writer(model_state), STATE_FILE: state_writer(train_state)},
                 background=not sync)
        if sync:
            assert mgr.wait(600)
        out.append(time.perf_counter() - t0)
        assert mgr.wait(600)  # (async) let the upload finish before the next measurement
    return out


def restart_times(root: str, env: dict) -> tuple[float, float]:
    from tests.helpers.runner import CONFIG, Trainer, voxrelay
    from tests.helpers.tiny import tiny

    assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
    args = ("train.max_steps=100000", "train.eval_every=100000", "checkpoint.every_steps=5", "train.log_every=1")
    result = []
    for _ in ("fresh", "restart"):
        t0 = time.perf_counter()
        trainer = Trainer(root, env, *args)
        assert trainer.first_step.wait(300), trainer.output()
        result.append(time.perf_counter() - t0)
        time.sleep(1.0)  # let a few checkpoints commit
        trainer.proc.kill()
        trainer.proc.wait()
    return result[0], result[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu", help="where the state lives (cuda: the save copies it to the host)")
    ap.add_argument("--local", action="store_true", help="a local folder as the bucket (no S3 server, no restart "
                    "timing): what a card without moto runs")
    args = ap.parse_args()
    model_state, train_state, params = make_state(args.hidden, args.layers, args.device)
    if not args.local:
        from tests.helpers.servers import S3Server, apply_env  # moto: not on a card
    with (contextlib.nullcontext() if args.local else S3Server()) as s3, tempfile.TemporaryDirectory() as tmp:
        if s3 is not None:
            apply_env(s3.env())
        root = f"{tmp}/bucket" if s3 is None else f"s3://{s3.bucket}/bench"
        mgr = CheckpointManager(f"{root}/runs/stall", keep_last=2, staging_dir=Path(tmp) / "staging")
        size = sum(meta["size"] for meta in mgr.save(0, {
            MODEL_FILE: model_writer(model_state), STATE_FILE: state_writer(train_state)}).manifest["files"].values())
        assert mgr.wait(600)
        sync = timed_saves(mgr, model_state, train_state, args.repeats, 100, sync=True)
        async_ = timed_saves(mgr, model_state, train_state, args.repeats, 200, sync=False)
        mgr.close(60)
        print(f"state: {params / 1e6:.1f}M parameters on {args.device}, checkpoint {size / 2**20:.0f} MiB, "
              f"{'a local folder' if s3 is None else 'S3 server on 127.0.0.1'}")
        print(f"sync save+upload blocks training {statistics.median(sync):.2f} s (runs: "
              f"{', '.join(f'{x:.2f}' for x in sync)})")
        print(f"async save blocks training       {statistics.median(async_):.2f} s (runs: "
              f"{', '.join(f'{x:.2f}' for x in async_)})")
        if s3 is not None:
            import os

            env = dict(os.environ, VOXRELAY_CACHE=str(Path(tmp) / "cache"), OMP_NUM_THREADS="1")
            fresh, restart = restart_times(f"{root}/tiny", env)
            print(f"process start to first step: fresh {fresh:.1f} s, restart from a checkpoint {restart:.1f} s "
                  f"(ratio {restart / fresh:.2f})")
        print(f"ratio {statistics.median(async_) / statistics.median(sync):.3f}")


if __name__ == "__main__":
    main()
