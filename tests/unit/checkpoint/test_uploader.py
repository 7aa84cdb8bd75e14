"""The upload thread never drops a checkpoint retention would keep (issue 33 W1): the uploader is held busy on
an Event while later saves arrive, then released (forced interleavings, no sleeps)."""

import threading
import uuid

import torch

from voxrelay.checkpoint.manager import MODEL_FILE, STATE_FILE, model_writer, state_writer
from voxrelay.checkpoint.staging import Staging, Uploader
from voxrelay.checkpoint.store import CommittedStore


class _GatedStore(CommittedStore):
    """A real store whose first upload waits for ``release`` after saying it ``started``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started, self.release, self.order = threading.Event(), threading.Event(), []

    def upload(self, folder, manifest, parts_wait_s=None):
        if not self.started.is_set():
            self.started.set()
            assert self.release.wait(30), "the test never released the upload"
        self.order.append(manifest["step"])
        return super().upload(folder, manifest, parts_wait_s)


def _writers(step):
    return {MODEL_FILE: model_writer({"w": torch.full((3,), float(step))}), STATE_FILE: state_writer({"step": step})}


def _scored(loss):
    return {"metrics": {"eval/loss": loss}}


def _busy_uploader(tmp_path, **retention):
    store = _GatedStore(f"memory://up-{uuid.uuid4().hex}", **retention)
    uploader = Uploader(store, Staging(tmp_path / "staging"), max_staged=3)
    uploader.start()
    uploader.submit_snapshot(1, _writers(1), {})
    assert store.started.wait(30)  # step 1's upload is under way and holds the thread
    return store, uploader


def test_an_evaluated_snapshot_waiting_behind_a_busy_upload_is_kept(tmp_path):
    store, uploader = _busy_uploader(tmp_path, keep_last=1, keep_best=True)
    uploader.submit_snapshot(2, _writers(2), _scored(0.5))  # the best eval: keep_best must keep it
    uploader.submit_snapshot(3, _writers(3), _scored(0.9))
    uploader.submit_snapshot(4, _writers(4), {})
    uploader.submit_snapshot(5, _writers(5), {})  # supersedes the plain step 4, not the evaluated ones
    assert uploader.holds(2) and not uploader.holds(4)
    store.release.set()
    assert uploader.wait(30)
    uploader.close(5)
    assert sorted(c.step for c in store.list()) == [2, 5]  # keep_last=1 plus the best
    assert store.list()[-1].metrics["eval/loss"] == 0.5


def test_more_evaluated_snapshots_than_max_staged_drop_the_worst(tmp_path):
    store, uploader = _busy_uploader(tmp_path, keep_last=1, keep_best=True)
    for step, loss in [(2, 0.7), (3, 0.2), (4, 0.9), (5, 0.4)]:
        uploader.submit_snapshot(step, _writers(step), _scored(loss))
    assert [uploader.holds(s) for s in (2, 3, 4, 5)] == [True, True, False, True]
    store.release.set()
    assert uploader.wait(30)
    uploader.close(5)
    assert sorted(c.step for c in store.list()) == [3, 5]


def test_a_staged_checkpoint_keep_last_keeps_is_uploaded_after_a_newer_one(tmp_path):
    """The README's test run failed on this: steps 9 and 10 due (keep_last=2), 10 uploaded first, 9 dropped."""
    store, uploader = _busy_uploader(tmp_path, keep_last=2)
    for step in (2, 3):
        uploader.submit(uploader.staging.stage(step, _writers(step), {}))
    store.release.set()
    assert uploader.wait(30)
    uploader.close(5)
    assert store.order == [1, 3, 2]  # the newest first (least work lost if the machine goes now), then step 2
    assert sorted(c.step for c in store.list()) == [2, 3] and uploader.durable_step == 3
    assert uploader.staging.list() == []


def test_a_staged_checkpoint_retention_would_delete_is_superseded(tmp_path):
    store, uploader = _busy_uploader(tmp_path, keep_last=1, keep_every=4)
    for step in (2, 4, 5):
        uploader.submit(uploader.staging.stage(step, _writers(step), {}))
    store.release.set()
    assert uploader.wait(30)
    uploader.close(5)
    assert store.order == [1, 5, 4]  # step 2 is superseded by 5; step 4 is a keep_every step
    assert sorted(c.step for c in store.list()) == [4, 5] and uploader.staging.list() == []
