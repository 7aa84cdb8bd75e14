"""What durability costs in throughput: `voxrelay train` (its own loop, data stream and checkpoint manager) on
the same data and steps, saving a checkpoint every few seconds vs never, runs alternating so machine noise hits
both alike; the root is a local folder or the S3 test server (moto on 127.0.0.1).

    .venv/bin/python bench/checkpoint_overhead.py [--steps 60] [--repeats 3] [--every-minutes 0.05] [--s3 | --root R]

Prints each run's training wall time (from the first step to the final checkpoint committed; building the run
left out) and the checkpoints saved.
Last line: ``ratio <audio-s/s with checkpoints / audio-s/s without>`` (goal >= 0.97).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from voxrelay.cli import demo_config_path  # noqa: E402
from voxrelay.config import load_config  # noqa: E402
from voxrelay.data.prepare import prepare  # noqa: E402
from voxrelay.train.build import build_run  # noqa: E402
from voxrelay.train.loop import train  # noqa: E402

DATA = ["data.sources=[{type: demo, minutes: 20, seed: 0, voices: [en-us]}]", "train.eval_every=100000",
        "monitor.tensorboard=false", "checkpoint.keep_last=2", "train.eval_synth=0"]


def one_run(root: str, name: str, steps: int, every_minutes: float | None) -> tuple[float, float, int]:
    """(audio seconds trained, seconds ``train`` took incl. the final save and upload, checkpoints saved)."""
    save = ["checkpoint.every_steps=null", f"checkpoint.every_minutes={every_minutes}"] if every_minutes else \
        [f"checkpoint.every_steps={steps * 10}"]  # never, but the final one (both runs save that)
    cfg = load_config(str(demo_config_path()), [f"root={root}", f"name={name}", f"train.max_steps={steps}",
                                                *DATA, *save])
    run = build_run(cfg, fresh=True)
    saves, save = [0], run.checkpoints.save

    def counted(*args, **kwargs):
        saves[0] += 1
        return save(*args, **kwargs)

    run.checkpoints.save = counted
    t0 = time.perf_counter()
    train(run)
    return run.loop.audio_seconds_seen, time.perf_counter() - t0, saves[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--every-minutes", type=float, default=0.05)
    ap.add_argument("--s3", action="store_true", help="the root on the S3 test server instead of a local folder")
    ap.add_argument("--root", help="a local root where this bench's data is prepared already (bench/throughput.py's)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides for both sides, e.g. model.hidden_size=1024")
    args = ap.parse_args()
    DATA.extend(args.overrides)
    with tempfile.TemporaryDirectory() as tmp:
        if args.s3:
            from tests.helpers.servers import S3Server, apply_env

            server = S3Server()
            server.__enter__()
            apply_env(server.env())
            root = f"s3://{server.bucket}/bench"
        else:
            root = args.root or f"{tmp}/root"
        if not args.root:
            prepare(load_config(str(demo_config_path()), [f"root={root}", *DATA]))
        rates: dict[str, list[float]] = {"none": [], "every": []}
        for r in range(args.repeats):
            for kind, every in (("none", None), ("every", args.every_minutes)):
                audio, took, saved = one_run(root, f"{kind}-{r}", args.steps, every)
                rates[kind].append(audio / took)
                print(f"{kind:5s} run {r}: {args.steps} steps in {took:.1f} s, {audio / took:.1f} audio-s/s, "
                      f"{saved} checkpoints saved", flush=True)
    none, every = statistics.median(rates["none"]), statistics.median(rates["every"])
    print(f"median audio-s/s: no checkpoints {none:.1f}, a checkpoint every {args.every_minutes * 60:.0f} s "
          f"{every:.1f}")
    print(f"ratio {every / none:.3f}")


if __name__ == "__main__":
    main()
