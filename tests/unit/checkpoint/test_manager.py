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


def test_io_stats_report_upload_rate_backlog_and_free_disk(mgr):
    """What each log line reports of checkpoint I/O: no upload rate before the first commit; after it the MB of
    the committed files over the seconds their upload took, an empty backlog, the staging disk's free space."""
    mgr.start()
    before = mgr.io_stats()
    assert "upload_mb_s" not in before and before["staging_backlog"] == 0 and before["staging_free_gb"] > 0
    ckpt = _save(mgr, 10)
    size, seconds = mgr.uploader.uploaded
    assert size == sum(f["size"] for f in ckpt.manifest["files"].values()) > 0 and seconds > 0
    after = mgr.io_stats()
    assert after["upload_mb_s"] == pytest.approx(size / 1e6 / seconds) and after["staging_backlog"] == 0


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
    assert _wait_until(lambda: uploader.last_error is not None, 60)  # its first try failed
    assert uploader.durable_step is None and "connection refused" in uploader.last_error
    kept = [c.step for c in staging.list()]
    assert 4 in kept and len(kept) <= 3  # the newest is kept; at most max_staged (+ the one in flight)
    assert not uploader.close(timeout=0.2)  # never committed


def _fetched(mgr):
    return sorted(p.name for p in (mgr.staging.folder / "fetched").glob("*"))


def test_fetched_copy_is_removed_after_loading(mgr, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    _save(mgr, 10)
    _save(mgr, 20)
    ckpt, folder = mgr.latest_valid()
    assert ckpt.durable and folder.parent.name == "fetched" and _fetched(mgr) == ["step-00000020"]
    ckpt, model, state = mgr.load()
    assert ckpt.step == 20 and torch.equal(model["w"], torch.full((3,), 20.0)) and state["loop"]["step"] == 20
    assert _fetched(mgr) == []  # in memory now: the local copy is gone
    assert mgr.load_model(step=10)[0].step == 10 and _fetched(mgr) == []


def test_staged_checkpoint_is_not_removed_by_loading(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    run = f"memory://ckpt-{uuid.uuid4().hex}"
    first = CheckpointManager(run, staging_dir=tmp_path / "staging")
    first.start()
    first.uploader.close()  # killed before the upload: the staged folder is the only copy
    first.staging.stage(40, _writers(40), {})
    second = CheckpointManager(run, staging_dir=tmp_path / "staging")
    assert second.load()[0].step == 40 and second.load_model()[0].step == 40
    assert [c.step for c in second.staging.list()] == [40]
    assert (tmp_path / "staging" / "step-00000040" / MODEL_FILE).exists()


def test_processes_of_one_machine_share_the_fetched_copy_until_start(mgr, monkeypatch):
    _save(mgr, 10)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert mgr.load()[0].step == 10 and _fetched(mgr) == ["step-00000010"]
    # the other process reuses the verified local files: it loads even with the bucket's copy gone
    storage.delete(storage.join(mgr.store.root_uri, "step-00000010", MODEL_FILE))
    other = CheckpointManager(mgr.run_uri, staging_dir=mgr.staging.folder)
    assert other.load(step=10)[0].step == 10
    other.start()  # the main process, once every process has loaded
    assert _fetched(mgr) == []
    other.close(5)


def _tamper(mgr, step: int, name: str, payload: bytes = b"evil bytes") -> None:
    """Add ``name`` (with matching size and sha256) to the committed manifest of ``step`` and put
    the payload where storage.join puts it: only the name's check can stop the download."""
    import hashlib

    folder = storage.join(mgr.store.root_uri, f"step-{step:08d}")
    manifest = storage.read_json(storage.join(folder, MANIFEST))
    manifest["files"][name] = {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    storage.write_bytes(storage.join(folder, name), payload)
    storage.write_json(storage.join(folder, MANIFEST), manifest)


@pytest.mark.parametrize("name", ["../evil", "../../evil", "ABSOLUTE", "a/evil", "..", "", "a\\evil", "e\0vil"])
def test_manifest_names_outside_the_checkpoint_mark_it_damaged(mgr, tmp_path, caplog, name):
    if name == "ABSOLUTE":
        name = str(tmp_path / "outside" / "evil")
    _save(mgr, 10)
    _save(mgr, 20)
    if "\0" not in name and name not in ("", ".."):
        _tamper(mgr, 20, name)
    else:  # names no storage accepts: only the manifest can carry them
        folder = storage.join(mgr.store.root_uri, "step-00000020")
        manifest = storage.read_json(storage.join(folder, MANIFEST))
        manifest["files"][name] = {"size": 1, "sha256": "0" * 64}
        storage.write_json(storage.join(folder, MANIFEST), manifest)
    ckpt, model, _ = mgr.load()
    assert [p for p in tmp_path.rglob("*evil*")] == []  # nothing written anywhere
    assert ckpt.step == 10 and torch.equal(model["w"], torch.full((3,), 10.0))
    assert "not a plain file name" in caplog.text and "step-00000020" in caplog.text
    with pytest.raises(CheckpointError, match="no checkpoint at step 20"):
        mgr.load(step=20)


def test_fetch_and_verify_refuse_a_tampered_manifest(mgr, tmp_path):
    from voxrelay.checkpoint.store import Checkpoint, verify_folder

    _save(mgr, 10)
    _tamper(mgr, 10, "../evil")
    uri = storage.join(mgr.store.root_uri, "step-00000010")
    manifest = storage.read_json(storage.join(uri, MANIFEST))
    dest = tmp_path / "dest" / "step-00000010"
    with pytest.raises(CheckpointError, match="'../evil', which is not a plain file name"):
        mgr.store.fetch(Checkpoint(10, uri, manifest, durable=True), dest)
    assert not (tmp_path / "dest" / "evil").exists()
    with pytest.raises(CheckpointError, match="not a plain file name"):
        verify_folder(dest, manifest)
    with pytest.raises(CheckpointError, match="not a plain file name"):
        mgr.store.upload(dest, manifest)


@pytest.mark.parametrize("elsewhere", [["../../x"], "model.safetensors", [["a"]]])
def test_a_manifests_elsewhere_list_names_only_its_own_files(mgr, elsewhere):
    """Issue 33 X2: the other machines' parts a manifest lists are names of its own file list, never paths."""
    from voxrelay.checkpoint.store import ELSEWHERE, check_manifest

    _save(mgr, 10)
    manifest = storage.read_json(storage.join(mgr.store.root_uri, "step-00000010", MANIFEST))
    assert check_manifest(manifest | {ELSEWHERE: sorted(manifest["files"])[:1]})
    with pytest.raises(CheckpointError, match="elsewhere list must name files of its file list"):
        check_manifest(manifest | {ELSEWHERE: elsewhere})


class _CountingStore:
    """A bucket whose every upload fails with ``error`` (a fake: the uploader's own logic is under test;
    tests/integration exercises the real servers)."""

    def __init__(self, error: Exception):
        from voxrelay.checkpoint.store import CommittedStore

        self.error, self.calls, self.store = error, 0, CommittedStore("memory://never")

    def upload(self, folder, manifest):
        self.calls += 1
        raise self.error

    def retain(self):
        pass


def _wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_a_snapshot_is_staged_at_once_while_the_uploader_backs_off(tmp_path):
    from voxrelay.checkpoint.staging import Staging, Uploader

    store = _CountingStore(ConnectionError("connection refused"))
    staging = Staging(tmp_path / "staging")
    uploader = Uploader(store, staging, max_backoff=120, base_backoff=120)  # a 120 s wait after the 1st failure
    uploader.start()
    uploader.submit(staging.stage(1, _writers(1), {}))
    assert _wait_until(lambda: store.calls == 1, 10)
    uploader.submit_snapshot(2, _writers(2), {})
    # written to disk within seconds, not after the backoff: a SIGKILL now loses only what is after step 2
    assert _wait_until(lambda: 2 in [c.step for c in staging.list()], 20), "step 2 waited in memory"
    assert _wait_until(lambda: store.calls >= 2, 20)  # and its upload was tried right away (after staging)
    assert not uploader.close(timeout=0.1)


def test_a_permanent_upload_error_is_not_retried(tmp_path):
    from voxrelay.checkpoint.staging import Staging, Uploader

    store = _CountingStore(PermissionError("Access Denied"))
    staging = Staging(tmp_path / "staging")
    uploader = Uploader(store, staging, base_backoff=0.01)
    uploader.start()
    uploader.submit(staging.stage(1, _writers(1), {}))
    assert not uploader.wait(timeout=30)  # returns as soon as the error is known to be permanent
    assert "Access Denied" in uploader.fatal and store.calls == 1
    assert [c.step for c in staging.list()] == [1]  # the checkpoint stays staged on local disk
    uploader.close(timeout=1)
    assert store.calls == 1


def test_a_stray_file_with_a_step_name_is_not_a_checkpoint(tmp_path):
    # e.g. a user's `gsutil cp` of one file to checkpoints/step-00000030 on a local-folder bucket
    m = CheckpointManager(str(tmp_path / "run" / "checkpoints"), keep_last=5, staging_dir=tmp_path / "staging")
    try:
        _save(m, 10)
        (tmp_path / "run" / "checkpoints" / "step-00000030").write_bytes(b"not a checkpoint")
        assert [c.step for c in m.store.list()] == [10]
        assert m.load()[0].step == 10
        _save(m, 20)  # retention and the next save still work
        assert [c.step for c in m.store.list()] == [20, 10]
    finally:
        m.close(5)
