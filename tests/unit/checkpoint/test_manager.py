import errno
import shutil
import time
import uuid
from collections import namedtuple

import pytest
import torch

from voxrelay import storage
from voxrelay.checkpoint.manager import MODEL_FILE, STATE_FILE, CheckpointManager, model_writer, state_writer
from voxrelay.checkpoint.store import MANIFEST, CheckpointError


@pytest.fixture
def mgr(tmp_path):
    m = CheckpointManager(f"memory://ckpt-{uuid.uuid4().hex}", keep_last=2, staging_dir=tmp_path / "staging")
    yield m
    m.close(5)


def _writers(step):
    return {MODEL_FILE: model_writer({"w": torch.full((3,), float(step))}),
            STATE_FILE: state_writer({"loop": {"step": step}, "t": torch.arange(step)})}


def _save(mgr, step, **extra):
    ckpt = mgr.save(step, _writers(step), extra)
    assert mgr.wait(30)
    return ckpt


def test_save_commits_in_background_and_retains(mgr):
    for step in (10, 20, 30):
        _save(mgr, step)
    assert [c.step for c in mgr.store.list()] == [30, 20]
    assert mgr.durable_step == 30
    assert mgr.staging.list() == []  # uploaded -> staging freed
    ckpt, model, state = mgr.load()
    assert ckpt.step == 30 and ckpt.durable and torch.equal(model["w"], torch.full((3,), 30.0))
    assert state["loop"]["step"] == 30 and torch.equal(state["t"], torch.arange(30))
    assert mgr.load(step=20)[0].step == 20


def test_background_save_copies_the_state_first(mgr):
    live = torch.zeros(4)
    assert mgr.save(5, {MODEL_FILE: model_writer({"w": live}), STATE_FILE: state_writer({"t": live})},
                    background=True) is None
    live += 1  # training goes on and changes the tensors while the thread writes
    assert mgr.wait(30)
    _, model, state = mgr.load()
    assert torch.equal(model["w"], torch.zeros(4)) and torch.equal(state["t"], torch.zeros(4))


def test_keep_every_and_keep_best(tmp_path):
    m = CheckpointManager(f"memory://ckpt-{uuid.uuid4().hex}", keep_last=2, keep_every=20, keep_best=True,
                          staging_dir=tmp_path / "s")
    for step, loss in ((10, 1.0), (20, 3.0), (30, 2.0), (40, 4.0), (50, 5.0)):
        m.save(step, _writers(step), {"metrics": {"eval/loss": loss}})
        assert m.wait(30)
    assert sorted(c.step for c in m.store.list()) == [10, 20, 40, 50]  # best 10, every 20: 20, 40, last 2: 40, 50
    m.close(5)


def test_no_manifest_no_checkpoint(mgr):
    _save(mgr, 10)
    _save(mgr, 20)
    storage.delete(storage.join(mgr.store.root_uri, "step-00000020", MANIFEST))
    assert mgr.load()[0].step == 10


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "delete"])
@pytest.mark.parametrize("name", [MODEL_FILE, STATE_FILE])
def test_damaged_newest_falls_back_with_warning(mgr, caplog, damage, name):
    _save(mgr, 10)
    _save(mgr, 20)
    uri = storage.join(mgr.store.root_uri, "step-00000020", name)
    data = storage.read_bytes(uri)
    if damage == "truncate":
        storage.write_bytes(uri, data[: len(data) // 2])
    elif damage == "bitflip":
        flipped = bytearray(data)
        flipped[len(flipped) // 2] ^= 0x01
        storage.write_bytes(uri, bytes(flipped))
    else:
        storage.delete(uri)
    assert mgr.load()[0].step == 10
    assert name in caplog.text and "falling back" in caplog.text
    with pytest.raises(CheckpointError, match="damaged"):
        mgr.load(step=20)


def test_staged_but_not_uploaded_is_found_and_uploaded_by_next_session(tmp_path):
    run = f"memory://ckpt-{uuid.uuid4().hex}"
    first = CheckpointManager(run, staging_dir=tmp_path / "staging")
    first.start()
    first.uploader.close()  # the upload thread is gone: staged only, like a kill before upload
    first.staging.stage(40, _writers(40), {})
    assert first.store.list() == []
    second = CheckpointManager(run, staging_dir=tmp_path / "staging")
    assert second.load()[0].step == 40 and not second.load()[0].durable
    second.start()
    assert second.wait(30) and [c.step for c in second.store.list()] == [40]
    second.close(5)


def test_killed_staging_leaves_nothing_and_full_disk_is_a_clear_error(mgr, monkeypatch):
    _save(mgr, 10)
    leftover = mgr.staging.folder / ".tmp-step-00000020-999"  # a save killed midway
    leftover.mkdir(parents=True)
    assert mgr.staging.list() == [] and leftover.exists()  # listing (e.g. `status`) changes nothing
    CheckpointManager(mgr.run_uri, staging_dir=mgr.staging.folder).start()  # the next trainer cleans up
    assert not leftover.exists()
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10 << 30, 10 << 30, 1 << 20))
    with pytest.raises(CheckpointError, match="not enough space.*VOXRELAY_CACHE"):
        mgr.save(20, _writers(20), {}, expected_bytes=100 << 20)
    monkeypatch.undo()

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointError, match="full"):
        mgr.save(30, {MODEL_FILE: full}, {})
    assert [c.step for c in mgr.store.list()] == [10]  # committed one untouched
    assert mgr.load()[0].step == 10


def test_empty_run_has_no_checkpoint(mgr):
    assert mgr.load() is None
    with pytest.raises(CheckpointError, match="train first"):
        mgr.load_model()


def test_unreachable_bucket_keeps_a_bounded_number_of_staged_checkpoints(tmp_path):
    from voxrelay.checkpoint.staging import Staging, Uploader
    from voxrelay.checkpoint.store import CommittedStore

    class DownStore(CommittedStore):  # a bucket that refuses every connection
        def upload(self, folder, manifest):
            raise ConnectionError("connection refused")

    staging = Staging(tmp_path / "staging")
    uploader = Uploader(DownStore("memory://down"), staging, max_staged=2, max_backoff=0.05)
    uploader.start()
    for step in (1, 2, 3, 4):
        uploader.submit(staging.stage(step, _writers(step), {}))
    time.sleep(0.3)
    assert uploader.durable_step is None and "connection refused" in uploader.last_error
    kept = [c.step for c in staging.list()]
    assert 4 in kept and len(kept) <= 3  # the newest is kept; at most max_staged (+ the one in flight)
    assert not uploader.close(timeout=0.2)  # never committed
