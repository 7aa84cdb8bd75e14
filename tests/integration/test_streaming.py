"""Training streamed from a bucket (the S3 test server) with shuffle windows much smaller than the split, a
local shard cache and a RAM cache smaller than the data, and batches built ahead on a thread: a run SIGKILLed
after a checkpoint and resumed ends with the weights of a run never interrupted (1 and 2 processes, the
processes of a node sharing one cache), and the local cache stays under ``cache.max_gb``."""

from __future__ import annotations

import os
import re
import time

import pytest

from tests.helpers.runner import CONFIG, Trainer, assert_same_weights, env_for, final_weights, torchrun, voxrelay
from tests.helpers.tiny import tiny
from voxrelay import storage
from voxrelay.checkpoint.store import CommittedStore
from voxrelay.data.rowindex import LENGTHS_DIR, rows_file

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # tiers: see tests/conftest.py

CAP_GB = 0.00002  # ~21 KB: a few of the ~3 KB shards; the split is larger
SETTINGS = ("data.shard_size=2", "train.shuffle_window=2", f"cache.max_gb={CAP_GB}", "cache.ram_gb=0.000001",
            "cache.prefetch_shards=2", "train.prefetch_batches=2", "train.max_steps=24", "checkpoint.every_steps=2",
            "train.eval_every=100", "model.dropout=0.1")


def _run(root: str, env: dict, nproc: int, *extra: str):
    args = ("train", CONFIG, *tiny(root, *SETTINGS, *extra))
    res = torchrun(nproc, *args, env=env) if nproc > 1 else voxrelay(*args, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


# two processes (each streams its own part of the batches; one process runs the same cursor code): CI time
@pytest.mark.parametrize("nproc", [2])
def test_a_streamed_run_killed_and_resumed_equals_a_straight_one(tmp_path, s3_root, nproc):
    cache = tmp_path / "cache"
    env = env_for(cache) | {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    res = voxrelay("prepare", CONFIG, *tiny(s3_root, *SETTINGS), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    prepared = storage.join(s3_root, "prepared", "demo")
    index = storage.read_json(storage.join(prepared, "index.json"))
    train_shards = sum(s["split"] == "train" for s in index["shards"])
    assert train_shards >= 5 and index["row_index"]["train"] == rows_file("train")  # windows of 2 really cut it
    _run(s3_root, env, nproc, "name=straight")
    assert storage.listdir(storage.join(prepared, LENGTHS_DIR))  # lengths computed once, cached in the bucket
    trainer = Trainer(s3_root, env, *SETTINGS, "name=killed", nproc=nproc)
    checkpoints = storage.join(s3_root, "runs", "killed", "checkpoints")
    deadline = time.monotonic() + 180
    while not CommittedStore(checkpoints).list() and time.monotonic() < deadline and trainer.proc.poll() is None:
        time.sleep(0.05)
    trainer.kill()  # right after its first checkpoint is committed
    assert CommittedStore(checkpoints).list(), trainer.output()
    res = _run(s3_root, env, nproc, "name=killed")
    resumed = re.search(r"resuming \S+ from step (\d+)", res.stderr)
    assert resumed and int(resumed.group(1)) < 24, res.stderr  # the second session really trained
    step_a, a = final_weights(storage.join(s3_root, "runs", "straight"), cache / "fetch")
    step_b, b = final_weights(storage.join(s3_root, "runs", "killed"), cache / "fetch")
    assert step_a == step_b == 24
    assert_same_weights(a, b)
    cached = [p.stat().st_size for p in (cache / "prepared").rglob("*.parquet")]
    assert cached and sum(cached) <= CAP_GB * 2**30, cached  # evicted to stay under cache.max_gb
