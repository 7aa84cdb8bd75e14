"""The save/resume/stop decisions of a multi-process job, on a default process group that refuses CPU
tensors as NCCL does, and with ranks whose clocks disagree.

Two real processes (torch.distributed, this file run as a script). Their default group is gloo registered
for the ``cuda`` device alone (FACTS.md): any collective on CPU tensors raises "No backend type associated
with device type cpu", exactly as over accelerate's NCCL-only group on GPUs, where every multi-GPU run used
to crash at its first save (``gather_rng`` gathered CPU tensors over the default group). What the ranks agree
on goes over :class:`voxrelay.train.ranks.Ranks` (a gloo group of the job's own): RNG states, the step to
resume from, and every step's decision (:class:`voxrelay.train.stops.Stops`) — rank 1's clock runs ahead
and 3x fast, rank 0's does not, and both take the same decisions: saves on rank 0's clock, the stop when
rank 1 reaches the time limit (exit 77, not a preemption), a signal on one rank stops both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

WORLD = 2


def _launch(tmp_path: Path, scenario: str) -> list[dict]:
    from tests.helpers.servers import free_port

    port, outs = free_port(), [tmp_path / f"rank{r}.json" for r in range(WORLD)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, scenario, str(r), str(port), str(outs[r]), str(tmp_path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(WORLD)]
    logs = [p.communicate(timeout=180)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return [json.loads(o.read_text()) for o in outs]


def test_cpu_values_go_over_their_own_group_when_the_default_one_refuses_cpu_tensors(tmp_path):
    results = _launch(tmp_path, "collectives")
    for rank, res in enumerate(results):
        assert res["default_group_refuses_cpu"], res  # the emulation holds: what NCCL does to CPU tensors
        assert res["old_gather_rng_error"] and "No backend type" in res["old_gather_rng_error"]
        assert res["rng_ranks"] == [0, 1]  # every rank's own RNG state, in rank order
        assert res["broadcast"] == 17 and res["any"] is True and res["none"] is False
        assert res["rank"] == rank


def test_ranks_with_skewed_clocks_take_the_same_decisions(tmp_path):
    results = _launch(tmp_path, "skewed")
    decisions = [r["decisions"] for r in results]
    assert decisions[0] == decisions[1]  # step by step, both ranks decided the same
    saves = [step for step, stop, save in decisions[0] if save]
    assert saves == [6, 12], decisions[0]  # rank 0's clock: every 6 s (rank 1's says every 2 s)
    last_step, stop, _ = decisions[0][-1]
    assert stop == "train.time_limit" and last_step == 13  # rank 1's clock reached the limit first (rank 0's: 59)
    assert results[0]["exit_code"] == results[1]["exit_code"] == 77  # a time limit, not "another process stopped"


def test_a_signal_on_one_rank_stops_every_rank_with_its_reason_and_time(tmp_path):
    results = _launch(tmp_path, "signal")
    assert results[0]["decisions"] == results[1]["decisions"]
    last_step, stop, save = results[0]["decisions"][-1]
    assert (last_step, stop) == (3, "SIGTERM")
    assert results[0]["notice_age"] == results[1]["notice_age"] == pytest.approx(0.0)  # rank 1's, just now
    assert results[0]["exit_code"] == 75


def test_example_lengths_are_computed_by_every_rank_for_its_share_of_the_shards(tmp_path):
    """A first session's example lengths (the tokenizer over every row's text: minutes at 10k hours) are split
    among the job's processes by shard; gathered, they are those one process computes, in row-index order, and
    cached in the bucket for the next session (which computes nothing)."""
    from voxrelay.data import rowindex as ri

    index = _prepared(tmp_path / "prepared")
    results = _launch(tmp_path, "lengths")
    expected = ri.plan_lengths(_length, "single", str(tmp_path / "prepared"),
                               ri.RowIndex.load(str(tmp_path / "prepared"), index, "train"))
    assert results[0]["lengths"] == results[1]["lengths"] == expected.tolist()
    assert results[0]["read"] == [0, 2, 4] and results[1]["read"] == [1, 3]  # each its own shards, none twice
    assert results[0]["again"] == results[1]["again"] == 0  # the second session read them from the bucket


def _prepared(uri: Path) -> dict:
    """A train split of 5 shards of 4 rows each (text of varied length) with its row index."""
    import numpy as np

    from voxrelay import storage
    from voxrelay.data import rowindex as ri
    from voxrelay.data import shards as sh

    index, metas = {"num_codebooks": 1, "shards": [], "identity": {"x": 1}}, []
    for n in range(5):
        utts = [sh.EncodedUtterance(f"s{n}-r{i}", "word " * (1 + (7 * n + 3 * i) % 9), None, None, 1.0,
                                    np.zeros((1, 10 + n + i), dtype=np.int16)) for i in range(4)]
        storage.write_bytes(sh.shard_uri(str(uri), f"train-{n:05d}"), sh.encode_table(utts))
        index["shards"].append({"name": f"train-{n:05d}", "split": "train"})
        metas.append(ri.row_meta(utts))
    index["row_index"] = {"train": ri.write_row_index(str(uri), "train", metas)}
    storage.write_json(storage.join(str(uri), sh.INDEX_FILE), index)
    return index


def _length(meta) -> int:
    return len(meta.text) + meta.num_frames


# ---------------------------------------------------------------------------------------------- the workers


def _lengths(rank: int, tmp: Path) -> dict:
    from voxrelay import storage
    from voxrelay.data import rowindex as ri
    from voxrelay.train.data import example_lengths
    from voxrelay.train.ranks import Ranks

    ranks, uri = Ranks.of_job(), str(tmp / "prepared")
    index = storage.read_json(storage.join(uri, "index.json"))
    rows = ri.RowIndex.load(uri, index, "train")
    read: list[int] = []

    def length(meta) -> int:
        shard = int(meta.id.split("-")[0][1:])
        if not read or read[-1] != shard:
            read.append(shard)
        return _length(meta)

    cfg = SimpleNamespace(model=SimpleNamespace(model_dump=lambda mode: {"model": 1}), prepared_uri=uri)
    first = example_lengths(SimpleNamespace(length=length), cfg, index, rows, ranks)
    seen = len(read)
    again = example_lengths(SimpleNamespace(length=length), cfg, index, rows, ranks)
    assert again.tolist() == first.tolist()
    return {"lengths": first.tolist(), "read": read[:seen], "again": len(read) - seen}


class FakeClock:
    """time.time and time.monotonic of one rank: ``offset`` ahead, ``rate`` times as fast, advanced by hand."""

    def __init__(self, offset: float = 0.0, rate: float = 1.0):
        self.elapsed, self.offset, self.rate = 0.0, offset, rate

    def install(self) -> None:
        time.time = lambda: 1_000_000.0 + self.offset + self.elapsed * self.rate
        time.monotonic = lambda: 500.0 + self.elapsed * self.rate


def _init(rank: int, port: int) -> None:
    import torch.distributed as dist
    from torch.distributed import ProcessGroupGloo

    dist.Backend.register_backend("cudaonly", lambda store, r, size, timeout: ProcessGroupGloo(store, r, size, timeout),
                                  devices=["cuda"])
    dist.init_process_group("cudaonly", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)


def _collectives(rank: int) -> dict:
    import torch
    import torch.distributed as dist

    from voxrelay.train import state as st
    from voxrelay.train.ranks import Ranks
    from voxrelay.train.resume import gather_rng

    try:
        dist.all_reduce(torch.zeros(1))
        refuses = False
    except RuntimeError as err:
        refuses = "No backend type associated with device type cpu" in str(err)
    try:  # what gather_rng did before: its first all_gather of CPU tensors over the default group
        dist.all_gather([torch.zeros(1, dtype=torch.int64) for _ in range(WORLD)], torch.tensor([1]))
        old_error = None
    except RuntimeError as err:
        old_error = str(err)
    ranks = Ranks.of_job()
    torch.manual_seed(rank)  # each rank its own RNG state
    rngs = gather_rng(ranks)
    seeded = []
    for r in range(WORLD):
        torch.manual_seed(r)
        seeded.append(st.rng_state()["torch"])
    return {"rank": rank, "default_group_refuses_cpu": refuses, "old_gather_rng_error": old_error,
            "rng_ranks": [next(s for s in range(WORLD) if torch.equal(rngs[r]["torch"], seeded[s]))
                          for r in range(WORLD)],
            "broadcast": ranks.broadcast(17 if rank == 0 else None), "any": ranks.any(rank == 1),
            "none": ranks.any(False)}


def _decisions(rank: int, tmp: Path, clock: FakeClock, signal_at: int | None) -> dict:
    from voxrelay.checkpoint import preemption as pre
    from voxrelay.checkpoint.manager import CheckpointManager
    from voxrelay.checkpoint.stops import exit_code
    from voxrelay.cli import demo_config_path
    from voxrelay.config import load_config
    from voxrelay.data.loader import Cursor
    from voxrelay.train.ranks import Ranks
    from voxrelay.train.state import LoopState
    from voxrelay.train.stops import Stops

    ranks = Ranks.of_job()
    cfg = load_config(demo_config_path(), [f"root={tmp}/root", "train.time_limit=60s"])
    run = SimpleNamespace(cfg=cfg, ranks=ranks, loop=LoopState(), lease=None, usage=None,
                          stream=SimpleNamespace(cursor=Cursor()),
                          checkpoints=CheckpointManager(cfg.run_uri, staging_dir=tmp / f"staging{rank}"))
    watcher = pre.PreemptionWatcher("off")
    # both ranks started at the same real moment; rank 1's clock says it is later, and runs faster
    stops = Stops(run, watcher, pre.Deadline(60.0, None, 1_000_000.0), pre.SaveTrigger(None, 0.1, None))
    decisions = []
    while True:
        clock.elapsed += 1.0  # a step of one second
        run.loop.step += 1
        if run.loop.step == signal_at and rank == 1:
            watcher._on_signal(15, None)
        decision = stops.agree(1.0)
        if decision.save:
            stops.trigger.saved(0.01)
        decisions.append([run.loop.step, decision.stop, decision.save])
        if decision.stop:
            return {"decisions": decisions, "exit_code": exit_code(decision.stop, True),
                    "notice_age": decision.notice_age}


def main(scenario: str, rank: int, port: int, out: Path, tmp: Path) -> None:
    clock = FakeClock(offset=20.0, rate=3.0) if rank == 1 and scenario == "skewed" else FakeClock()
    if scenario not in ("collectives", "lengths"):
        clock.install()
    _init(rank, port)
    if scenario == "collectives":
        result = _collectives(rank)
    elif scenario == "lengths":
        result = _lengths(rank, tmp)
    else:
        result = _decisions(rank, tmp, clock, 3 if scenario == "signal" else None)
    out.write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # gloo's threads can abort a normal interpreter exit (as voxrelay's Run.exit says)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]))


def test_grace_is_counted_from_the_notice_not_from_the_end_of_the_save():
    """``checkpoint.grace_seconds`` is what is left of the platform's window: the seconds since the earliest
    notice (any rank's, when decided) and since the decision both come off it."""
    from voxrelay.train.stops import Decision, Stops

    stops = Stops(SimpleNamespace(cfg=SimpleNamespace(checkpoint=SimpleNamespace(grace_seconds=25.0))), None, None,
                  None)
    assert stops.grace_left(Decision("sigterm")) == 25.0  # no notice: the whole grace
    decided = Decision("sigterm", notice_age=10.0, decided_at=time.monotonic() - 4.0)  # the save took 4 s
    assert 10.5 <= stops.grace_left(decided) <= 11.0
    assert stops.grace_left(Decision("sigterm", notice_age=30.0)) == 0.0  # past the window: no wait at all
