"""A train.strategy=fsdp job over two machines, simulated on one: two `torchrun --nnodes 2` launches on 127.0.0.1,
each with its own VOXRELAY_CACHE (shard cache and checkpoint staging) and the S3 test server as the only thing they
share. Each node stages and uploads its own rank's DCP shards; rank 0 commits the manifest once every part is in
the bucket. Killed after its first committed checkpoint and relaunched on both nodes, the run ends with the weights
of a run never interrupted (dropout on: every rank's RNG is restored)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.runner import (
    CONFIG,
    Trainer,
    assert_same_weights,
    can_hide_folders,
    env_for,
    final_weights,
    free_port,
    node_launcher,
    voxrelay,
)
from tests.helpers.tiny import tiny
from voxrelay import storage
from voxrelay.checkpoint.store import ELSEWHERE, CommittedStore

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # tiers: see tests/conftest.py

STEPS = 12
SETTINGS = ("train.strategy=fsdp", "model.dropout=0.1", "train.eval_every=100", "train.schedule=constant",
            "data.shard_size=4", "train.shuffle_window=2", f"train.max_steps={STEPS}", "checkpoint.every_steps=2")


HIDE = can_hide_folders()


def _nodes(root: str, caches: list[Path], name: str) -> list[Trainer]:
    """Both nodes' launches; where mount namespaces exist each node sees an empty folder in place of the other's
    cache (as on two machines: a path of one machine's disk means nothing on the other)."""
    port = free_port()
    for cache in caches:
        cache.mkdir(parents=True, exist_ok=True)
    return [Trainer(root, _env(cache), *SETTINGS, f"name={name}",
                    launcher=node_launcher(node, 2, port, hide=[c for c in caches if c != cache] if HIDE else []))
            for node, cache in enumerate(caches)]


def _env(cache: Path) -> dict:
    return env_for(cache) | {k: v for k, v in os.environ.items() if k.startswith("AWS_")}


def _finish(nodes: list[Trainer]) -> str:
    deadline, hung = time.monotonic() + 600, False
    for node in nodes:
        try:
            node.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True  # killed below: its lines say where it waited
        node.kill()  # reaps it and collects its last lines
    out = "\n".join(f"--- node {i}\n{n.output()}" for i, n in enumerate(nodes))
    assert not hung and all(n.proc.returncode == 0 for n in nodes), ("hung: " if hung else "") + out
    return out


def _staged_shards(cache: Path) -> set[str]:
    return {p.name for p in (cache / "staging").rglob("*.distcp")}


def test_two_nodes_without_a_shared_disk_checkpoint_are_killed_and_resume_exactly(tmp_path, s3_root):
    caches = [tmp_path / "node0", tmp_path / "node1"]
    res = voxrelay("prepare", CONFIG, *tiny(s3_root, *SETTINGS), env=_env(caches[0]))
    assert res.returncode == 0, res.stdout + res.stderr
    _finish(_nodes(s3_root, caches, "straight"))

    killed = _nodes(s3_root, caches, "killed")
    checkpoints = CommittedStore(storage.join(s3_root, "runs", "killed", "checkpoints"))
    deadline = time.monotonic() + 300
    while not checkpoints.list() and time.monotonic() < deadline and all(n.proc.poll() is None for n in killed):
        time.sleep(0.05)
    for node in killed:
        node.kill()  # both machines lost at once, right after the first commit
    first = checkpoints.list()
    assert first, "\n".join(n.output() for n in killed)
    # the committed manifest names both ranks' shards, each uploaded by the node that wrote it
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(first[0].manifest["files"])
    assert first[0].manifest[ELSEWHERE] == ["__1_0.distcp"]  # staged on node 1's disk, not on node 0's
    assert storage.file_sizes(first[0].uri).keys() >= first[0].manifest["files"].keys()

    out = _finish(_nodes(s3_root, caches, "killed"))
    resumed = re.search(r"resuming \S+ from step (\d+)", out)
    assert resumed and int(resumed.group(1)) < STEPS, out  # the second session really trained
    step_a, a = final_weights(storage.join(s3_root, "runs", "straight"), tmp_path / "fetch")
    step_b, b = final_weights(storage.join(s3_root, "runs", "killed"), tmp_path / "fetch")
    assert step_a == step_b == STEPS
    assert_same_weights(a, b)
    # each node's staged shards went to the bucket and its fetched copy of the resumed checkpoint was removed
    assert not _staged_shards(caches[0]) and not _staged_shards(caches[1])
