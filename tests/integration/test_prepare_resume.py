"""A killed prepare re-run skips committed shards; several processes split the work."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.tiny import tiny
from voxrelay.cli import demo_config_path

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

VOXRELAY = [sys.executable, "-m", "voxrelay"]


def _prepare_cmd(root: Path, cache: Path, *extra: str) -> tuple[list[str], dict]:
    env = dict(os.environ, VOXRELAY_CACHE=str(cache))
    return [*VOXRELAY, "prepare", str(demo_config_path()), *tiny(str(root), "data.shard_size=1", *extra)], env


def test_killed_prepare_resumes_without_redoing_committed_shards(tmp_path):
    root, cache = tmp_path / "bucket", tmp_path / "cache"
    shards = root / "prepared/demo/shards"
    cmd, env = _prepare_cmd(root, cache)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 240
    while time.time() < deadline and len(list(shards.glob("*.done"))) < 2:
        time.sleep(0.002)  # one row per shard and a tight poll: the kill lands mid-prepare
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {p.name: p.stat().st_mtime_ns for p in shards.glob("*.done")}
    assert len(done_before) >= 2, proc.stdout.read().decode()
    assert not (root / "prepared/demo/index.json").exists()  # killed before the commit of the whole

    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"reused {len(done_before)}" in res.stdout
    for name, mtime in done_before.items():
        assert (shards / name).stat().st_mtime_ns == mtime  # not rewritten
    index = json.loads((root / "prepared/demo/index.json").read_text())
    assert sum(s["rows"] for s in index["shards"]) == index["counts"]["train"] + index["counts"]["eval"]


def test_two_processes_split_the_shards(tmp_path):
    root, cache = tmp_path / "bucket", tmp_path / "cache"
    procs = []
    for rank in (0, 1):
        cmd, env = _prepare_cmd(root, cache)
        env |= {"RANK": str(rank), "WORLD_SIZE": "2"}
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    index = json.loads((root / "prepared/demo/index.json").read_text())
    n = len(index["shards"])
    assert n >= 4
    # each rank wrote its own half: neither reused anything, both wrote
    assert "prepared" in outs[0] and f"shards written {(n + 1) // 2}" in outs[0]
    for s in index["shards"]:  # what a node's cached copy is checked against (issue 33 C3)
        assert s["sha256"] == hashlib.sha256((root / "prepared/demo/shards" / f"{s['name']}.parquet").read_bytes()
                                             ).hexdigest()
    names = [s["name"] for s in index["shards"]]  # in plan order: shard i belongs to rank i % 2
    for rank, out in enumerate(outs):
        wrote = {name for name in names if f"shard {name}:" in out}
        assert wrote == set(names[rank::2]), (rank, wrote, out)
