"""What keeps a run from being stranded or silently damaged: retention counts only whole checkpoints and
never deletes the one a session resumed from; a run whose every checkpoint is damaged is refused, not
restarted at step 0; a previous session's staged checkpoint is verified before upload; a failed save leaves
no partial folder and is counted; saving a step already on its way is a no-op; a reader falls back when
retention deletes the checkpoint it is reading."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from voxrelay import storage
from voxrelay.checkpoint import store as store_module
from voxrelay.checkpoint.manager import MODEL_FILE, STATE_FILE, CheckpointManager, model_writer, state_writer
from voxrelay.checkpoint.store import MANIFEST, CheckpointError, step_name


def _manager(tmp_path: Path, run: str | None = None, **kw) -> CheckpointManager:
    return CheckpointManager(run or f"memory://dur-{uuid.uuid4().hex}", staging_dir=tmp_path / "staging", **kw)


def _writers(step: int) -> dict:
    return {MODEL_FILE: model_writer({"w": torch.full((64,), float(step))}),
            STATE_FILE: state_writer({"loop": {"step": step}})}


def _save(mgr: CheckpointManager, *steps: int) -> None:
    for step in steps:
        mgr.save(step, _writers(step))
        assert mgr.wait(30)


def _truncate(mgr: CheckpointManager, step: int) -> None:
    """What a VM powered off mid-upload by an older version left: a manifest over a short file."""
    uri = storage.join(mgr.store.root_uri, step_name(step), MODEL_FILE)
    storage.write_bytes(uri, storage.read_bytes(uri)[:10])


def _steps(mgr: CheckpointManager) -> list[int]:
    return [c.step for c in mgr.store.list()]


def _earlier_session(tmp_path: Path, truncated: tuple[int, ...], keep_last: int = 2) -> CheckpointManager:
    """A run a previous session left with checkpoints 10 and 20, those of ``truncated`` damaged; a manager
    of the next session on it."""
    earlier = _manager(tmp_path, keep_last=keep_last)
    _save(earlier, 10, 20)
    earlier.close(5)
    for step in truncated:
        _truncate(earlier, step)
    return _manager(tmp_path, run=earlier.run_uri, keep_last=keep_last)


def test_retention_counts_only_whole_checkpoints_and_keeps_the_resumed_one(tmp_path):
    mgr = _earlier_session(tmp_path, truncated=(20,))
    try:
        _save(mgr, 30)  # keep_last=2 whole ones: 30 and 10; the damaged 20 does not count, and goes
        assert _steps(mgr) == [30, 10]
        mgr.store.protected.add(10)  # this session resumed from it
        _save(mgr, 40, 50)
        assert _steps(mgr) == [50, 40, 10]
    finally:
        mgr.close(5)


def test_damaged_checkpoints_are_kept_while_too_few_whole_ones_exist(tmp_path):
    mgr = _earlier_session(tmp_path, truncated=(10,), keep_last=3)
    try:
        _save(mgr, 30)  # whole: 30 and 20, fewer than keep_last: nothing is deleted, the damaged one neither
        assert _steps(mgr) == [30, 20, 10]
    finally:
        mgr.close(5)


def test_a_run_whose_every_checkpoint_is_damaged_is_refused_naming_them(tmp_path):
    mgr = _earlier_session(tmp_path, truncated=(10, 20))
    with pytest.raises(CheckpointError) as err:
        mgr.open()
    msg = str(err.value)
    assert "none of the 2 checkpoint(s)" in msg and "step-00000020" in msg and "step-00000010" in msg
    assert "Nothing was deleted" in msg and "--fresh" in msg
    assert _steps(mgr) == [20, 10]


def test_a_previous_sessions_damaged_staged_checkpoint_is_not_uploaded(tmp_path, caplog):
    first = _manager(tmp_path, run=f"memory://dur-{uuid.uuid4().hex}")
    staged = first.staging.stage(7, _writers(7), {})  # staged, never uploaded (the session died)
    model = Path(staged.uri) / MODEL_FILE
    model.write_bytes(model.read_bytes()[:10])  # a power loss before the data reached the disk
    second = _manager(tmp_path, run=first.run_uri)
    second.start()
    try:
        assert second.wait(30)
        assert _steps(second) == [] and second.staging.list() == []  # dropped, not committed
        assert "is damaged" in caplog.text and MODEL_FILE in caplog.text
    finally:
        second.close(5)


def test_a_failed_write_leaves_no_partial_folder_and_is_counted(tmp_path):
    mgr = _manager(tmp_path)

    def broken(path):
        path.write_bytes(b"half")
        raise RuntimeError("safetensors: out of disk quota")  # not an OSError

    try:
        for _ in range(2):
            mgr.save(3, {MODEL_FILE: broken}, background=True)
            assert mgr.wait(30)
        assert not list((tmp_path / "staging").glob(".tmp-*"))
        assert mgr.uploader.failed_saves == 2 and "out of disk quota" in mgr.uploader.save_error
        _save(mgr, 4)
        assert mgr.uploader.failed_saves == 0  # a save that works resets the count
    finally:
        mgr.close(5)


def test_saving_a_step_already_on_its_way_is_a_no_op(tmp_path, monkeypatch):
    mgr = _manager(tmp_path)
    entered, release = threading.Event(), threading.Event()
    upload = mgr.store.upload

    def held_upload(folder, manifest):
        entered.set()
        assert release.wait(30)
        return upload(folder, manifest)

    monkeypatch.setattr(mgr.store, "upload", held_upload)
    try:
        first = mgr.save(5, _writers(5))
        assert entered.wait(30)  # step 5 is being uploaded
        inode = (Path(first.uri) / MODEL_FILE).stat().st_ino
        assert mgr.save(5, _writers(5)) is None  # e.g. the save after an out-of-memory step
        assert (Path(first.uri) / MODEL_FILE).stat().st_ino == inode  # the uploader's files untouched
        release.set()
        assert mgr.wait(30) and _steps(mgr) == [5]
        ckpt, weights, _ = mgr.load_model()
        assert ckpt.step == 5 and torch.equal(weights["w"], torch.full((64,), 5.0))
    finally:
        release.set()
        mgr.close(5)


def test_a_reader_lists_again_when_retention_deletes_what_it_reads(tmp_path, monkeypatch):
    """A synthesize/eval beside a training run: it lists 20 and 10 and starts reading 20; meanwhile the run
    commits 30 and 40, and its retention (keep_last=2) deletes 20 and 10. The reader loads 40."""
    writer = _manager(tmp_path, keep_last=2)
    _save(writer, 10, 20)
    get_file = storage.get_file
    target = storage.join(writer.store.root_uri, step_name(20))

    def training_meanwhile(uri, local):
        if uri.startswith(target) and storage.exists(storage.join(target, MANIFEST)):
            _save(writer, 30, 40)
        return get_file(uri, local)

    monkeypatch.setattr(store_module.storage, "get_file", training_meanwhile)
    try:
        reader = _manager(tmp_path / "reader", run=writer.run_uri)
        ckpt, weights, _ = reader.load_model()
        assert _steps(writer) == [40, 30]  # what it first listed is gone
        assert ckpt.step == 40 and torch.equal(weights["w"], torch.full((64,), 40.0))
    finally:
        writer.close(5)


def test_an_unreadable_manifest_counts_as_damaged_and_is_never_deleted_as_a_leftover(tmp_path):
    earlier = _manager(tmp_path, keep_last=2)
    _save(earlier, 10, 20)
    earlier.close(5)
    for step in (10, 20):  # e.g. written by a newer voxrelay, or cut by a broken disk
        storage.write_text(storage.join(earlier.store.root_uri, step_name(step), MANIFEST), "{not json")
    with pytest.raises(CheckpointError, match="none of the 2 checkpoint"):
        _manager(tmp_path, run=earlier.run_uri).open()  # refused, not a fresh start at step 0
    mgr = _manager(tmp_path, run=earlier.run_uri, keep_last=2)
    try:
        _save(mgr, 5, 15, 25)  # what --fresh-less training at step 0 would have done: their folders stay
        names = storage.listdir(mgr.store.root_uri)
        assert step_name(10) in names and step_name(20) in names
    finally:
        mgr.close(5)


def test_a_damaged_checkpoint_at_a_step_is_saved_again_when_training_reaches_it(tmp_path):
    mgr = _earlier_session(tmp_path, truncated=(20,), keep_last=3)
    try:
        assert mgr.open()[0].step == 10  # resumed from the whole one
        mgr.store.protected.add(10)
        mgr.start()
        assert mgr.durable_step == 10 and not mgr.holds(20)
        _save(mgr, 20)  # not skipped as "already saved": the one there is damaged
        ckpt, weights, _ = mgr.load_model()
        assert ckpt.step == 20 and torch.equal(weights["w"], torch.full((64,), 20.0))
    finally:
        mgr.close(5)


def test_an_upload_cut_short_is_never_committed(tmp_path, monkeypatch):
    mgr = _manager(tmp_path)
    put_file = storage.put_file

    def short_put(local, uri):
        put_file(local, uri)
        if uri.endswith(MODEL_FILE):
            storage.write_bytes(uri, storage.read_bytes(uri)[:5])  # the copy arrived cut short

    monkeypatch.setattr(store_module.storage, "put_file", short_put)
    staged = mgr.staging.stage(9, _writers(9), {})
    with pytest.raises(OSError, match="incomplete"):
        mgr.store.upload(Path(staged.uri), json.loads((Path(staged.uri) / MANIFEST).read_text()))
    assert _steps(mgr) == []  # no manifest over a short file


def test_a_damaged_staged_copy_of_a_committed_step_falls_back_to_the_committed_copy(tmp_path):
    """A session killed while it cleaned up the staged copy of a step it had already committed (the staged
    folder lost its model file): the next session resumes from the committed copy of that step, not from
    the step before (seen in CI: a resume from step 2 with step 4 committed)."""
    earlier = _manager(tmp_path, keep_last=3)
    _save(earlier, 2, 4)
    earlier.close(5)
    staged = earlier.staging.stage(4, _writers(4), {})
    (Path(staged.uri) / MODEL_FILE).unlink()
    ckpt, folder = _manager(tmp_path, run=earlier.run_uri, keep_last=3).latest_valid()
    assert ckpt.step == 4 and ckpt.durable
    assert torch.equal(load_file(str(folder / MODEL_FILE))["w"], torch.full((64,), 4.0))


def test_wait_returns_after_the_retention_that_follows_the_commit(tmp_path, monkeypatch):
    """wait() (and close) return once the commit's retention is done too: a caller that lists the checkpoints
    right after sees what retention left (seen in CI under load: the damaged step 20 still listed)."""
    mgr = _manager(tmp_path, keep_last=2)
    retain, finished = mgr.store.retain, []

    def slow_retain(*pending):
        time.sleep(0.3)  # a slow bucket listing: the commit is done, the retention not yet
        retain(*pending)
        finished.append(True)

    monkeypatch.setattr(mgr.store, "retain", slow_retain)
    try:
        _save(mgr, 10)
        assert finished == [True]
    finally:
        mgr.close(5)


def test_an_evaluated_checkpoint_is_uploaded_not_superseded_by_a_newer_save(tmp_path, monkeypatch):
    """keep_best: the save of the best eval (step 2) is still waiting for the bucket when step 3 is saved; it is
    uploaded anyway, so retention can keep it (it used to be superseded and vanish: seen under load in CI)."""
    mgr = _manager(tmp_path, keep_last=2)
    upload, gate, started, seen = mgr.store.upload, threading.Event(), threading.Event(), []

    def slow_upload(folder, manifest):
        seen.append(manifest["step"])
        started.set()
        gate.wait(10)  # the bucket is slow: step 1 is on its way while 2 and 3 are saved
        return upload(folder, manifest)

    monkeypatch.setattr(mgr.store, "upload", slow_upload)
    try:
        mgr.save(1, _writers(1))
        # step 1 on its way before 2 is saved (else a busy host's uploader may start at 2 and 1 is superseded,
        # rightly: it was never evaluated)
        assert started.wait(30)
        mgr.save(2, _writers(2), {"metrics": {"eval/loss": 1.0}})
        mgr.save(3, _writers(3))  # staged here (not in the background): 2 and 3 wait behind step 1
        gate.set()
        assert mgr.wait(30)
        assert seen == [1, 2, 3] and 2 in _steps(mgr) and 3 in _steps(mgr)
    finally:
        mgr.close(5)
