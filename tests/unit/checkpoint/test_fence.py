"""Fencing everywhere (issue 33): every object a process writes to a run is preceded by a lease check, on every
machine of a job; an old job's other machines stop writing once the run is taken over."""

import time
from pathlib import Path

import pytest
import torch

from voxrelay import storage
from voxrelay.checkpoint.fence import LeaseFence
from voxrelay.checkpoint.lease import LeaseLost, RunLease
from voxrelay.checkpoint.manager import MODEL_FILE, STATE_FILE, CheckpointManager, model_writer, state_writer
from voxrelay.checkpoint.store import PART_SUFFIX


def _writers(step):
    return {MODEL_FILE: model_writer({"w": torch.full((3,), float(step))}), STATE_FILE: state_writer({"step": step})}


class _Flip:
    """A guard that lets ``allowed`` objects through, then says the lease was taken over (a forced interleaving:
    the take-over lands between two writes of one upload or one retention pass)."""

    def __init__(self, allowed: int):
        self.allowed, self.calls = allowed, 0

    def __call__(self):
        self.calls += 1
        if self.calls > self.allowed:
            raise LeaseLost("taken over by the test")


@pytest.mark.parametrize("backend", ["local", "s3_root", "gcs_root"])
def test_another_machines_part_upload_stops_once_the_run_is_taken_over(tmp_path: Path, backend: str, request) -> None:
    run = str(tmp_path / "bucket/runs/r") if backend == "local" else f"{request.getfixturevalue(backend)}/runs/r"
    lease = RunLease(run, 60)
    assert lease.acquire() is None  # rank 0's
    other = CheckpointManager(run, staging_dir=tmp_path / "m1", guard=LeaseFence(run, lease.record["token"]))
    part = other.staging.new_folder(2)
    (part / "__1_0.distcp").write_bytes(b"a" * 50)
    other.upload_part(2, part, ["__1_0.distcp"])  # the job's own lease: written
    assert "__1_0.distcp" in storage.file_sizes(storage.join(run, "checkpoints", "step-00000002"))

    # a new session takes the run over (the old lease looks expired to it by the clock, but it is live: the new
    # session waits the old lease's 60 s for a write in flight, here recorded instead of slept)
    waits: list[float] = []
    assert RunLease(run, 60, clock=lambda: time.time() + 1000, pause=waits.append).acquire(take_over=True)
    assert waits == [60]
    part = other.staging.new_folder(4)
    (part / "__1_0.distcp").write_bytes(b"b" * 50)
    with pytest.raises(LeaseLost, match="took over"):
        other.upload_part(4, part, ["__1_0.distcp"])
    assert storage.file_sizes(storage.join(run, "checkpoints", "step-00000004")) == {}  # not one object
    assert (part / "__1_0.distcp").exists()


@pytest.mark.parametrize("released", [True, False])
def test_a_released_or_deleted_lease_fences_the_jobs_other_machines(tmp_path: Path, released: bool) -> None:
    run = str(tmp_path / "bucket/runs/r")
    lease = RunLease(run, 60)
    lease.acquire()
    fence = LeaseFence(run, lease.record["token"])
    fence()  # ours
    if released:
        lease.release()
    else:
        storage.delete(storage.join(run, "lease.json"))
    with pytest.raises(LeaseLost, match="released or deleted"):
        fence()


def test_each_file_of_an_upload_is_fenced(tmp_path: Path) -> None:
    guard = _Flip(allowed=1)
    mgr = CheckpointManager(str(tmp_path / "bucket/runs/r"), staging_dir=tmp_path / "s", guard=guard)
    staged = mgr.staging.stage(2, _writers(2), {})
    with pytest.raises(LeaseLost):
        mgr.store.upload(Path(staged.uri), staged.manifest)
    assert len(storage.file_sizes(storage.join(mgr.run_uri, "checkpoints", "step-00000002"))) == 1
    assert mgr.store.list() == []


def test_a_part_manifest_is_fenced_after_its_files(tmp_path: Path) -> None:
    guard = _Flip(allowed=1)  # the part's file goes through, the take-over lands before its part manifest
    mgr = CheckpointManager(str(tmp_path / "bucket/runs/r"), staging_dir=tmp_path / "s", guard=guard)
    part = mgr.staging.new_folder(2)
    (part / "__1_0.distcp").write_bytes(b"a" * 50)
    with pytest.raises(LeaseLost):
        mgr.upload_part(2, part, ["__1_0.distcp"])
    names = storage.file_sizes(storage.join(mgr.run_uri, "checkpoints", "step-00000002"))
    assert "__1_0.distcp" in names and not any(n.endswith(PART_SUFFIX) for n in names)


def test_each_deletion_of_a_retention_pass_is_fenced(tmp_path: Path) -> None:
    run = str(tmp_path / "bucket/runs/r")
    mgr = CheckpointManager(run, keep_last=1, staging_dir=tmp_path / "s")
    for step in (1, 2, 3):
        staged = mgr.staging.stage(step, _writers(step), {})
        mgr.store.upload(Path(staged.uri), staged.manifest)
    guard = _Flip(allowed=1)  # taken over right after the first deletion (a doomed step's manifest)
    fenced = CheckpointManager(run, keep_last=1, staging_dir=tmp_path / "s", guard=guard)
    with pytest.raises(LeaseLost):
        fenced.store.retain()
    steps = [c.step for c in fenced.store.list()]
    assert len(steps) == 2 and steps[0] == 3  # one doomed step untouched: nothing deleted after the take-over


def test_each_deletion_of_fresh_is_fenced(tmp_path: Path) -> None:
    """--fresh deletes the run's checkpoints, metrics, usage record...: a take-over landing between two of them
    stops it there (the new holder's files are not deleted)."""
    from voxrelay.train.build import start_over

    run = str(tmp_path / "bucket/runs/r")
    mgr = CheckpointManager(run, staging_dir=tmp_path / "s")
    staged = mgr.staging.stage(1, _writers(1), {})
    mgr.store.upload(Path(staged.uri), staged.manifest)
    for name in ("metrics.jsonl", "usage.json"):
        storage.write_text(storage.join(run, name), "{}")
    fenced = CheckpointManager(run, staging_dir=tmp_path / "s", guard=_Flip(allowed=1))
    with pytest.raises(LeaseLost):
        start_over(run, fenced)
    assert [c.step for c in mgr.store.list()] == []  # the first deletion went through (the checkpoints)
    assert storage.exists(storage.join(run, "metrics.jsonl")) and storage.exists(storage.join(run, "usage.json"))
