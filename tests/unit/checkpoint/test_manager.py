import uuid

import pytest
import torch

from voxrelay import storage
from voxrelay.checkpoint.manager import MANIFEST, MODEL_FILE, STATE_FILE, CheckpointError, CheckpointManager


@pytest.fixture
def mgr():
    return CheckpointManager(f"memory://ckpt-{uuid.uuid4().hex}", keep_last=2)


def _save(mgr, step):
    return mgr.save(step, {"w": torch.full((3,), float(step))}, {"loop": {"step": step}, "t": torch.arange(step)})


def test_save_load_roundtrip_and_retention(mgr):
    for step in (10, 20, 30):
        _save(mgr, step)
    assert [c.step for c in mgr.committed()] == [30, 20]
    ckpt, model, state = mgr.load_latest()
    assert ckpt.step == 30 and torch.equal(model["w"], torch.full((3,), 30.0))
    assert state["loop"]["step"] == 30 and torch.equal(state["t"], torch.arange(30))
    assert mgr.load_latest(step=20)[0].step == 20


def test_no_manifest_no_checkpoint(mgr):
    _save(mgr, 10)
    ckpt = _save(mgr, 20)
    storage.delete(storage.join(ckpt.uri, MANIFEST))
    assert mgr.load_latest()[0].step == 10


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "delete"])
@pytest.mark.parametrize("name", [MODEL_FILE, STATE_FILE])
def test_damaged_newest_falls_back_with_warning(mgr, caplog, damage, name):
    _save(mgr, 10)
    ckpt = _save(mgr, 20)
    uri = storage.join(ckpt.uri, name)
    data = storage.read_bytes(uri)
    if damage == "truncate":
        storage.write_bytes(uri, data[: len(data) // 2])
    elif damage == "bitflip":
        flipped = bytearray(data)
        flipped[len(flipped) // 2] ^= 0x01
        storage.write_bytes(uri, bytes(flipped))
    else:
        storage.delete(uri)
    found = mgr.load_latest()
    assert found[0].step == 10
    assert name in caplog.text and "falling back" in caplog.text
    with pytest.raises(CheckpointError, match="damaged"):
        mgr.load_latest(step=20)


def test_empty_run_has_no_checkpoint(mgr):
    assert mgr.load_latest() is None
    with pytest.raises(CheckpointError, match="train first"):
        mgr.load_model()
