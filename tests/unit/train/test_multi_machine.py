"""A job over several machines resuming from a checkpoint staged on rank 0's disk only (its upload did not
finish before the last session died): rank 0 commits it before the others look, since they cannot read
rank 0's disk; if the bucket refuses it, every rank resumes from the newest committed checkpoint instead.
A sharded checkpoint staged on two machines' disks commits once the other machine's shards are in the bucket;
at resume, one whose shards got there is committed, one whose shards never did gives way to the previous one."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import torch

from voxrelay.checkpoint.manager import MODEL_FILE, STATE_FILE, CheckpointManager, model_writer, state_writer
from voxrelay.checkpoint.store import ELSEWHERE, PartsMissing, sha256_file
from voxrelay.train.build import commit_before_others_look, spans_machines


def _stage(mgr: CheckpointManager, step: int) -> None:
    weights = {"w": torch.full((3,), float(step))}
    mgr.staging.stage(step, {MODEL_FILE: model_writer(weights), STATE_FILE: state_writer({"step": step})}, {})


def test_a_checkpoint_staged_on_one_machine_is_committed_before_the_others_look(tmp_path: Path) -> None:
    run = tmp_path / "bucket/runs/r"
    mgr = CheckpointManager(str(run), staging_dir=tmp_path / "staging")
    _stage(mgr, 4)
    found = mgr.open()  # the ResumePoint training picks
    assert found.checkpoint.step == 4 and not found.checkpoint.durable and mgr.store.list() == []
    other_machine = CheckpointManager(str(run), staging_dir=tmp_path / "other-staging")
    assert other_machine.load() is None  # what another machine sees before the commit
    again = commit_before_others_look(mgr, found)
    assert again.checkpoint.step == 4
    ckpt, weights, _ = other_machine.load(4)  # now it reads the same checkpoint from the bucket
    assert ckpt.durable and torch.equal(weights["w"], torch.full((3,), 4.0))


def test_a_bucket_that_refuses_it_falls_back_to_the_newest_committed(tmp_path: Path) -> None:
    run = tmp_path / "bucket/runs/r"
    mgr = CheckpointManager(str(run), staging_dir=tmp_path / "staging")
    _stage(mgr, 2)
    mgr.store.upload(Path(mgr.staging.list()[0].uri), mgr.staging.list()[0].manifest)
    _stage(mgr, 4)
    staged = mgr.open()
    (Path(staged.checkpoint.uri) / MODEL_FILE).unlink()  # the upload fails (as a refusing bucket's would)
    found = commit_before_others_look(mgr, staged)
    assert found.checkpoint.step == 2 and [c.step for c in mgr.store.list()] == [2]  # committed: every machine reads it


def test_spans_machines(monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert not spans_machines(8) and spans_machines(16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert not spans_machines(4)  # not under torchrun: one machine


# ---------------------------------------------------------------- no shared disk: shards staged on two machines

def _stage_on_two_machines(tmp_path: Path, run: Path, step: int, extra: dict | None = None
                           ) -> tuple[CheckpointManager, CheckpointManager]:
    """What a save of a 2-machine sharded job leaves: machine 0 staged its shard, the state and a manifest naming
    machine 1's shard as ``elsewhere``; machine 1 holds its shard in a folder of its own staging disk."""
    main = CheckpointManager(str(run), staging_dir=tmp_path / "m0")
    other = CheckpointManager(str(run), staging_dir=tmp_path / "m1")
    name = main.staging.new_folder(step).name
    here, there = main.staging.folder / name, other.staging.folder / name
    there.mkdir(parents=True)
    (here / "__0_0.distcp").write_bytes(bytes([step]) * 100)
    torch.save({"step": step}, here / STATE_FILE)
    (there / "__1_0.distcp").write_bytes(bytes([step + 1]) * 70)
    files = {n: {"size": p.stat().st_size, "sha256": sha256_file(p)}
             for p in (here / "__0_0.distcp", here / STATE_FILE, there / "__1_0.distcp") for n in [p.name]}
    main.staging.commit(step, here, {"format_version": 1, "step": step, "time": 0.0, "files": files,
                                     ELSEWHERE: ["__1_0.distcp"], **(extra or {})})
    return main, other


def test_a_commit_waits_for_the_shards_another_machine_uploads(tmp_path: Path) -> None:
    run = tmp_path / "bucket/runs/r"
    main, other = _stage_on_two_machines(tmp_path, run, 4)
    staged = main.staging.list()[0]
    with pytest.raises(PartsMissing):  # machine 1 has not uploaded yet: no commit, no manifest in the bucket
        main.store.upload(Path(staged.uri), staged.manifest, parts_wait_s=0)
    assert main.store.list() == []
    there = other.staging.folder / next(other.staging.folder.iterdir()).name
    uploading = threading.Timer(0.3, other.upload_part, (4, there, ["__1_0.distcp"]))
    uploading.start()
    committed = main.store.upload(Path(staged.uri), staged.manifest, parts_wait_s=60)  # polls until it is there
    uploading.join()
    assert committed.step == 4 and [c.step for c in main.store.list()] == [4]
    assert not there.exists()  # machine 1 removed what it uploaded (and the folder, once empty)
    _, folder, _ = CheckpointManager(str(run), staging_dir=tmp_path / "m2").open()  # a third machine reads it whole
    assert (folder / "__1_0.distcp").read_bytes() == bytes([5]) * 70


def test_a_killed_jobs_staged_checkpoint_is_committed_at_resume_when_its_parts_reached_the_bucket(tmp_path: Path):
    run = tmp_path / "bucket/runs/r"
    main, other = _stage_on_two_machines(tmp_path, run, 4)
    there = next(other.staging.folder.iterdir())
    other.upload_part(4, there, ["__1_0.distcp"])  # machine 1 uploaded its shard; the job died before the commit
    ckpt, folder, _ = main.open()
    assert ckpt.step == 4 and ckpt.durable and [c.step for c in main.store.list()] == [4]
    assert (folder / "__1_0.distcp").read_bytes() == bytes([5]) * 70  # fetched beside machine 0's own files
    found = commit_before_others_look(main, main.open())  # nothing left to upload: the same checkpoint
    assert found[0].step == 4


def test_a_staged_checkpoint_whose_parts_never_arrived_gives_way_to_the_newest_committed(tmp_path: Path) -> None:
    run = tmp_path / "bucket/runs/r"
    mgr = CheckpointManager(str(run), staging_dir=tmp_path / "m0")
    _stage(mgr, 2)
    mgr.store.upload(Path(mgr.staging.list()[0].uri), mgr.staging.list()[0].manifest)
    main, _ = _stage_on_two_machines(tmp_path, run, 4)  # machine 1 died before uploading its shard of step 4
    ckpt, _, state = main.open()
    assert ckpt.step == 2 and state["step"] == 2  # not an error ("damaged"): the run goes on from step 2
    assert [c.step for c in main.staging.list()] == [2]  # step 4 can never be whole: removed
    assert [c.step for c in main.store.list()] == [2]


def test_the_first_checkpoint_never_completed_means_starting_over(tmp_path: Path) -> None:
    main, _ = _stage_on_two_machines(tmp_path, tmp_path / "bucket/runs/r", 2)
    assert main.open() is None and main.staging.list() == []


# ---------------------------------------------------------------- parts that never arrive (issue 33 D1)

def test_an_evaluated_checkpoint_whose_parts_never_arrived_is_abandoned_and_later_ones_commit(tmp_path, caplog):
    """Step 4 (evaluated: uploaded first) waits for machine 1's shard, which never comes; step 6 must still commit."""
    run = tmp_path / "bucket/runs/r"
    main, _ = _stage_on_two_machines(tmp_path, run, 4, {"metrics": {"eval/loss": 0.1}})
    _stage(main, 6)
    main.store.parts_wait_s = 0  # the commit's bounded wait for the parts has run out
    main.start()
    try:
        assert main.wait(30), main.uploader.last_error  # not retried forever: every later commit would wait
        assert [c.step for c in main.store.list()] == [6] and main.durable_step == 6
        assert main.staging.list() == []  # step 4 can never be whole: its staged folder is removed
        assert "step 4 is abandoned" in caplog.text and "__1_0.distcp is missing" in caplog.text
        assert main.uploader.fatal is None
    finally:
        main.close(5)


def test_checkpoints_abandoned_in_a_row_are_fatal(tmp_path):
    run = tmp_path / "bucket/runs/r"
    main, _ = _stage_on_two_machines(tmp_path, run, 2)
    for step in (4, 6):
        _stage_on_two_machines(tmp_path, run, step)
    main.store.parts_wait_s = 0
    main.start()
    try:
        assert not main.wait(30)  # training stops (stops.py: STORAGE) instead of going on with nothing committed
        fatal = main.uploader.fatal
        assert "abandoned" in fatal and all(s in fatal for s in ("2", "4", "6")) and "other machines" in fatal
        assert main.store.list() == []
    finally:
        main.close(5)


def test_another_machines_part_upload_is_retried_like_any_upload(tmp_path, monkeypatch):
    run = tmp_path / "bucket/runs/r"
    main, other = _stage_on_two_machines(tmp_path, run, 4)
    there = next(other.staging.folder.iterdir())
    real, calls = other.store.upload_files, []

    def flaky(folder, step, names):  # the bucket drops the first two tries (a blip), then takes the part
        calls.append(step)
        if len(calls) <= 2:
            raise ConnectionError("connection reset by peer")
        real(folder, step, names)

    monkeypatch.setattr(other.store, "upload_files", flaky)
    other.uploader.base_backoff = 0.001
    other.upload_part(4, there, ["__1_0.distcp"])
    assert len(calls) == 3 and not there.exists()
    staged = main.staging.list()[0]
    assert main.store.upload(Path(staged.uri), staged.manifest, parts_wait_s=0).step == 4


def test_a_permanent_part_upload_error_is_not_retried(tmp_path, monkeypatch):
    main, other = _stage_on_two_machines(tmp_path, tmp_path / "bucket/runs/r", 4)
    there, calls = next(other.staging.folder.iterdir()), []

    def denied(folder, step, names):
        calls.append(step)
        raise PermissionError("Access Denied")

    monkeypatch.setattr(other.store, "upload_files", denied)
    with pytest.raises(PermissionError):
        other.upload_part(4, there, ["__1_0.distcp"])
    assert calls == [4] and (there / "__1_0.distcp").exists()  # kept: nothing was uploaded


# ---------------------------------------------------------------- stale parts (issue 33 D3)

def _stale_part(tmp_path: Path, main: CheckpointManager, step: int, with_record: bool) -> None:
    """Machine 1's shard of ``step`` as an earlier upload left it in the bucket: the same size (DCP part sizes depend
    only on shapes), other bytes; with its part manifest (an earlier session's upload of that step) or without one
    (a fenced old job's stray write)."""
    old = tmp_path / "old"
    old.mkdir(exist_ok=True)
    (old / "__1_0.distcp").write_bytes(bytes([99]) * 70)
    if with_record:
        main.store.upload_part(old, step, {"__1_0.distcp": {"size": 70, "sha256": sha256_file(old / "__1_0.distcp")}})
    else:
        main.store.upload_files(old, step, ["__1_0.distcp"])


@pytest.mark.parametrize("with_record", [True, False])
@pytest.mark.parametrize("backend", ["local", "s3_root", "gcs_root"])
def test_a_stale_part_of_the_same_size_is_never_committed(tmp_path: Path, with_record: bool, backend: str,
                                                           request) -> None:
    """On the local folder and the S3 and GCS test servers (part manifests are found by listing)."""
    run = tmp_path / "bucket/runs/r" if backend == "local" else f"{request.getfixturevalue(backend)}/runs/r"
    main, other = _stage_on_two_machines(tmp_path, run, 4)
    _stale_part(tmp_path, main, 4, with_record)
    staged = main.staging.list()[0]
    with pytest.raises(PartsMissing, match="stale upload|not the one written"):
        main.store.upload(Path(staged.uri), staged.manifest, parts_wait_s=0)
    assert main.store.list() == []  # on size alone it was committed, and failed its sha256 at every load
    other.upload_part(4, next(other.staging.folder.iterdir()), ["__1_0.distcp"])  # this session's part arrives
    assert main.store.upload(Path(staged.uri), staged.manifest, parts_wait_s=0).step == 4
    _, folder, _ = CheckpointManager(str(run), staging_dir=tmp_path / "m2").open()  # loads whole elsewhere
    assert (folder / "__1_0.distcp").read_bytes() == bytes([5]) * 70


def test_start_keeps_a_staged_copy_whose_step_was_committed_with_other_bytes(tmp_path: Path) -> None:
    """Step 4 committed with other bytes (an old job's stale parts, before sha256 was checked): the staged copy is
    the good one; start() uploads it again instead of deleting it."""
    run = tmp_path / "bucket/runs/r"
    elsewhere = CheckpointManager(str(run), staging_dir=tmp_path / "old-job")
    elsewhere.staging.stage(4, {MODEL_FILE: model_writer({"w": torch.full((3,), 7.0)}),
                                STATE_FILE: state_writer({"step": 4})}, {})
    bad = elsewhere.staging.list()[0]
    elsewhere.store.upload(Path(bad.uri), bad.manifest)
    mgr = CheckpointManager(str(run), staging_dir=tmp_path / "m0")
    _stage(mgr, 4)
    good = mgr.staging.list()[0].manifest["files"][MODEL_FILE]["sha256"]
    mgr.start()
    try:
        assert mgr.wait(30)
        assert [c.manifest["files"][MODEL_FILE]["sha256"] for c in mgr.store.list()] == [good]
        assert torch.equal(mgr.load(4)[1]["w"], torch.full((3,), 4.0))
    finally:
        mgr.close(5)


def test_a_newer_commit_does_not_delete_the_parts_an_older_pending_checkpoint_waits_for(tmp_path, caplog):
    """Machine 1 uploaded its shards of steps 4 and 6 before rank 0's uploader got to either; the uploader commits
    the newest first. Retention after that commit must not take step 4's part in the bucket for a leftover: step 4
    is still to be committed (keep_last 3 keeps it), and without its part it would wait parts_wait_s, then be
    abandoned (one full-suite run of test_two_nodes hung there 600 s)."""
    run = tmp_path / "bucket/runs/r"
    main, other = _stage_on_two_machines(tmp_path, run, 4)
    _stage_on_two_machines(tmp_path, run, 6)
    for there in sorted(other.staging.folder.iterdir()):
        other.upload_part(int(re.search(r"step-(\d+)", there.name).group(1)), there, ["__1_0.distcp"])
    main.store.keep_last = 3
    main.store.parts_wait_s = 2
    main.start()
    try:
        assert main.wait(30), main.uploader.last_error
        assert [c.step for c in main.store.list()] == [6, 4], caplog.text
        assert "abandoned" not in caplog.text
    finally:
        main.close(5)
