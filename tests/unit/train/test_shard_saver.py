"""ShardSaver (train.strategy=fsdp checkpoints): the DCP write runs in a thread, so the save returns before the
shards are on disk and training may change the weights at once, while the checkpoint still holds the state of
its step; it is staged (manifest.json) only once written, and a process killed during the write leaves no
manifest, so loading ignores the folder. Deterministic: a hook holds DCP's write until the test releases it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import filesystem

from voxrelay.checkpoint.manager import STATE_FILE, CheckpointManager
from voxrelay.checkpoint.shard_saver import Shards, ShardSaver
from voxrelay.checkpoint.sharded import DCP_METADATA, rank_files, read_model
from voxrelay.checkpoint.store import MANIFEST
from voxrelay.train.ranks import Ranks

WRITE = filesystem._FileSystemWriter.write_data  # what every rank's DCP write calls (FileSystemWriter)


def _sharded_run(run_uri: str, staging: Path) -> SimpleNamespace:
    """A world of one process: a 2-layer model sharded by FSDP2, AdamW one step in (moments exist)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 3))
    mesh = init_device_mesh("cpu", (1,))
    for layer in module:
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)
    _train_step(module, optimizer)
    return SimpleNamespace(module=module, optimizer=optimizer, step=3, shards=Shards(module, optimizer, False,
                                                                                     Ranks(None, 0, 1)),
                           checkpoints=CheckpointManager(run_uri, staging_dir=staging))


def _save(saver: ShardSaver, run: SimpleNamespace, background: bool = True) -> None:
    saver.save(run.shards, run.checkpoints, run.step, {"loop": {"step": run.step}}, {"metrics": {}}, 0, background)


def _train_step(module, optimizer) -> None:
    module(torch.randn(4, 8)).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _full(module) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor().clone() for k, v in module.state_dict().items()}


@pytest.fixture
def gated_write(monkeypatch):
    """(entered, release): DCP's write waits for ``release`` once it has ``entered``."""
    entered, release = threading.Event(), threading.Event()

    def write_data(self, plan, planner):
        entered.set()
        assert release.wait(60), "the test never released the write"
        return WRITE(self, plan, planner)

    monkeypatch.setattr(filesystem._FileSystemWriter, "write_data", write_data)
    return entered, release


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_save_returns_before_the_write_and_stages_the_state_of_its_step(tmp_path, gated_write, world_of_one):
    entered, release = gated_write
    run = _sharded_run(str(tmp_path / "run"), tmp_path / "staging")
    try:
        saved = _full(run.module)
        saver = ShardSaver()
        _save(saver, run)  # returns while the write is held
        assert entered.wait(30)
        (folder,) = (tmp_path / "staging").glob(".tmp-*")
        assert not rank_files(folder, 0) and not (folder / DCP_METADATA).exists()
        assert run.checkpoints.staging.list() == [] and not (folder / MANIFEST).exists()
        _train_step(run.module, run.optimizer)  # training goes on and changes weights and moments in place
        assert not torch.equal(_full(run.module)["1.weight"], saved["1.weight"])
        release.set()
        saver.wait()  # staged: handed to the uploader
        assert run.checkpoints.wait(30)
        ckpt, folder = run.checkpoints.latest_valid()
        assert ckpt.step == 3 and set(ckpt.manifest["files"]) == {"__0_0.distcp", DCP_METADATA, STATE_FILE}
        restored = read_model(folder)  # the weights of step 3, not those trained after the save
        assert restored.keys() == saved.keys() and all(torch.equal(restored[k], saved[k]) for k in saved)
    finally:
        release.set()
        run.checkpoints.close(5)


def test_a_failed_asynchronous_write_is_reported_at_once_and_the_emergency_save_still_works(
        tmp_path, monkeypatch, world_of_one):
    failing = {"on": True}

    def write_data(self, plan, planner):
        if failing["on"]:
            raise OSError(28, "No space left on device")
        return WRITE(self, plan, planner)

    monkeypatch.setattr(filesystem._FileSystemWriter, "write_data", write_data)
    run = _sharded_run(str(tmp_path / "run"), tmp_path / "staging")
    try:
        saver = ShardSaver()
        _save(saver, run)  # in the background: returns before the write fails
        deadline = time.monotonic() + 30
        while run.checkpoints.uploader.failed_saves == 0:  # reported without waiting for the next save
            assert time.monotonic() < deadline, "the failed write was never reported"
            time.sleep(0.01)
        assert "No space left" in run.checkpoints.uploader.save_error
        failing["on"] = False
        _train_step(run.module, run.optimizer)
        run.step = 4
        _save(saver, run, background=False)  # the emergency save: not blocked by it
        assert run.checkpoints.wait(30)
        assert [c.step for c in run.checkpoints.store.list()] == [4]
        assert run.checkpoints.uploader.failed_saves == 0
    finally:
        run.checkpoints.close(5)


def test_a_kill_during_the_asynchronous_write_leaves_no_manifest(tmp_path):
    staging, marker = tmp_path / "staging", tmp_path / "written"
    proc = subprocess.Popen([sys.executable, __file__, str(tmp_path / "run"), str(staging), str(marker)],
                            env=os.environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)  # waits for the worker's own signal that it is mid-save; no guess about timing
    proc.kill()
    out = proc.communicate()[0]
    assert marker.read_text() == "returned", out  # the save returned, then the write was caught mid-way
    (folder,) = staging.glob(".tmp-*")
    assert rank_files(folder, 0) and not (folder / DCP_METADATA).exists()  # shards on disk, DCP unfinished
    assert not list(staging.rglob(MANIFEST))
    fresh = CheckpointManager(str(tmp_path / "run"), staging_dir=staging)
    assert fresh.candidates() == [] and fresh.latest_valid() is None
    fresh.start()  # the next session removes the leftover
    assert not folder.exists()
    fresh.close(5)


def _killed_worker(run_uri: str, staging: Path, marker: Path) -> None:
    """Save with a write that stops after the shards (before DCP's .metadata) and waits to be killed."""
    returned = threading.Event()

    def write_data(self, plan, planner):
        written = WRITE(self, plan, planner)
        written.wait()
        assert returned.wait(60)
        marker.write_text("returned")
        threading.Event().wait()  # until SIGKILL
        return written

    filesystem._FileSystemWriter.write_data = write_data
    run = _sharded_run(run_uri, staging)
    _save(ShardSaver(), run)
    returned.set()
    _train_step(run.module, run.optimizer)
    threading.Event().wait()


if __name__ == "__main__":
    _killed_worker(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
