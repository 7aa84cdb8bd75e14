"""Sharded (DCP) checkpoints through the CheckpointManager: a folder written in place on the staging disk,
staged with the files and sha256 its writers report, committed with manifest.json last; loading hands
back the verified folder (DCP loads it into the sharded model), export reads the model part only, and a
damaged shard is caught by its sha256."""

from __future__ import annotations

import uuid

import pytest
import torch
import torch.distributed.checkpoint as dcp

from voxrelay import storage
from voxrelay.checkpoint.manager import STATE_FILE, CheckpointManager
from voxrelay.checkpoint.sharded import DCP, DCP_METADATA, SHARDED, is_sharded, rank_files, read_model
from voxrelay.checkpoint.store import MANIFEST, CheckpointError, sha256_file


@pytest.fixture
def mgr(tmp_path):
    m = CheckpointManager(f"memory://sharded-{uuid.uuid4().hex}", keep_last=2, staging_dir=tmp_path / "staging")
    yield m
    m.close(5)


def _save(mgr: CheckpointManager, step: int) -> dict[str, torch.Tensor]:
    model = {"layer.weight": torch.full((4, 3), float(step)), "norm.weight": torch.arange(3.0) + step}
    folder = mgr.new_folder(step)
    # one process without a process group: DCP writes rank 0's file and .metadata
    dcp.save({"model": model, "optim": {"exp_avg": torch.ones(5) * step}}, checkpoint_id=str(folder))
    torch.save({"loop": {"step": step}}, folder / STATE_FILE)
    names = [p.name for p in rank_files(folder, 0)] + [DCP_METADATA, STATE_FILE]
    files = {n: {"size": (folder / n).stat().st_size, "sha256": sha256_file(folder / n)} for n in names}
    mgr.save_folder(step, folder, files, {SHARDED: DCP})
    assert mgr.wait(30)
    return model


def test_sharded_checkpoint_commits_every_file_and_loads_as_a_folder(mgr):
    saved = _save(mgr, 10)
    ckpt = mgr.store.list()[0]
    assert ckpt.step == 10 and is_sharded(ckpt.manifest)
    assert set(ckpt.manifest["files"]) == {"__0_0.distcp", DCP_METADATA, STATE_FILE}
    assert sorted(storage.listdir(ckpt.uri)) == sorted([*ckpt.manifest["files"], MANIFEST])
    found, folder, state = mgr.load()
    assert found.step == 10 and state["loop"]["step"] == 10
    assert (folder / DCP_METADATA).exists()  # kept for DCP; start() cleans fetched copies up
    assert read_model(folder).keys() == saved.keys()  # the optimizer's shards are not read
    _, weights, _ = mgr.load_model()  # export and synthesis: the fetched copy is removed once read
    assert weights.keys() == saved.keys() and all(torch.equal(weights[k], saved[k]) for k in saved)
    assert not folder.exists()


def test_a_damaged_shard_falls_back_to_the_previous_checkpoint(mgr, tmp_path):
    _save(mgr, 10)
    _save(mgr, 20)
    shard = storage.join(mgr.store.list()[0].uri, "__0_0.distcp")
    data = bytearray(storage.read_bytes(shard))
    data[-1] ^= 0xFF
    storage.write_bytes(shard, bytes(data))
    fresh = CheckpointManager(mgr.run_uri, staging_dir=tmp_path / "other")
    found, _, state = fresh.load()
    assert found.step == 10 and state["loop"]["step"] == 10
    with pytest.raises(CheckpointError, match="damaged"):
        fresh.load(step=20)
