"""What a local shuffle costs in quality: the demo trained with its rows shuffled globally vs within windows of a
few shards (``train.shuffle_window``), the same steps, seed and data (the demo's corpus cut into small shards so
that a window holds a small part of it, as 64 shards do of 10k hours).

    .venv/bin/python bench/shuffle_window.py [--steps 200] [--windows 0 4 16] [--shard-size 16]

Prints, per window, the held-out loss after ``--steps`` steps and the mean training loss of the last 20 steps.
Last line: ``ratio <held-out loss with the smallest window / with the global shuffle>`` (1.0: no cost).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from voxrelay.cli import demo_config_path
from voxrelay.config import load_config
from voxrelay.data.prepare import prepare
from voxrelay.train.build import build_run
from voxrelay.train.loop import train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--windows", type=int, nargs="+", default=[0, 4, 16])
    ap.add_argument("--shard-size", type=int, default=16)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="shuffle-window-")
    base = [f"root={root}", f"data.shard_size={args.shard_size}", f"train.max_steps={args.steps}",
            f"train.eval_every={args.steps}", "train.eval_synth=1", "eval.asr=null", "eval.speaker_similarity=false",
            f"checkpoint.every_steps={args.steps}", "monitor.tensorboard=false"]
    index = prepare(load_config(str(demo_config_path()), base))
    print(f"demo corpus: {index.counts['train']} training rows in shards of {args.shard_size}")
    results = {}
    for window in args.windows:
        cfg = load_config(str(demo_config_path()), [*base, f"name=window-{window}", f"train.shuffle_window={window}"])
        t = time.perf_counter()
        train(build_run(cfg))
        lines = [json.loads(x) for x in (Path(root) / "runs" / f"window-{window}" / "metrics.jsonl").read_text()
                 .splitlines()]
        held_out = next(x["eval/loss"] for x in reversed(lines) if "eval/loss" in x)
        tail = [x["loss"] for x in lines if "loss" in x and x["step"] > args.steps - 20]
        results[window] = held_out
        print(f"window {window or 'global'}: held-out loss {held_out:.4f}, last-20-step training loss "
              f"{sum(tail) / len(tail):.4f} ({time.perf_counter() - t:.0f} s)", flush=True)
    smallest = min(w for w in args.windows if w) if any(args.windows) else 0
    print(f"ratio {results[smallest] / results[0]:.3f}")


if __name__ == "__main__":
    main()
