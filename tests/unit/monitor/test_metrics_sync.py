"""(issue 33 W5) Syncing a remote run's metric files: a machine's stale local metrics.jsonl (another machine trained
the run since) never replaces the run's, and a sync uploads only the files changed since the last one (TensorBoard's
events and the eval wavs are not sent again at every checkpoint). On the S3 test server."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxrelay import storage
from voxrelay.config import build_config
from voxrelay.monitor.sinks import METRICS_FILE, build_monitor, read_jsonl


def _session(root: str, run_uri: str, machine: Path, steps: range) -> None:
    cfg = build_config({"root": root, "monitor": {"tensorboard": False}}, "test")
    monitor = build_monitor(cfg, run_uri, machine / "run", is_main=True)
    for step in steps:
        monitor.log(step, {"loss": 1.0 / step})
    monitor.close()  # the last sync, waited for


def test_a_stale_local_copy_never_replaces_the_runs_metrics(s3_root: str, tmp_path: Path) -> None:
    run_uri = storage.join(s3_root, "runs", "r")
    _session(s3_root, run_uri, tmp_path / "a", range(1, 3))  # machine A: steps 1-2
    _session(s3_root, run_uri, tmp_path / "b", range(3, 5))  # machine B resumes: steps 3-4
    _session(s3_root, run_uri, tmp_path / "a", range(5, 6))  # back on A, whose local copy stops at step 2
    assert [r["step"] for r in read_jsonl(storage.join(run_uri, METRICS_FILE))] == [1, 2, 3, 4, 5]
    # lines a session here logged but never uploaded (killed before its sync) are kept too
    with (tmp_path / "b" / "run" / METRICS_FILE).open("a") as f:
        f.write('{"step": 6, "time": 9999999999.0, "loss": 0.1}\n')
    _session(s3_root, run_uri, tmp_path / "b", range(7, 8))
    assert [r["step"] for r in read_jsonl(storage.join(run_uri, METRICS_FILE))] == [1, 2, 3, 4, 5, 6, 7]


def test_a_sync_uploads_only_what_changed(s3_root: str, tmp_path: Path) -> None:
    run_uri = storage.join(s3_root, "runs", "r")
    cfg = build_config({"root": s3_root, "monitor": {"tensorboard": False}}, "test")
    monitor = build_monitor(cfg, run_uri, tmp_path / "run", is_main=True)
    wav = tmp_path / "run" / "samples" / "step-00000002" / "utt.wav"
    wav.parent.mkdir(parents=True)
    wav.write_bytes(b"\0" * 200_000)  # an eval sample: sent once
    monitor.log(1, {"loss": 1.0})
    monitor.sync(wait=True)
    assert storage.exists(storage.join(run_uri, "samples/step-00000002/utt.wav"))
    monitor.log(2, {"loss": 0.5})
    before = storage.op_counts()
    monitor.sync(wait=True)
    sent = storage.op_counts()["bytes_written"] - before["bytes_written"]
    assert sent == (tmp_path / "run" / METRICS_FILE).stat().st_size  # metrics.jsonl alone: the wav is unchanged
    assert [r["step"] for r in read_jsonl(storage.join(run_uri, METRICS_FILE))] == [1, 2]
    monitor.close()


def test_a_take_over_during_a_sync_stops_it_at_the_next_file(s3_root: str, tmp_path: Path) -> None:
    """Issue 33 fencing: the lease is checked before each object a metrics sync writes, not once per sync. The
    take-over is forced right after the first file's check (the guard's hook), so the second is never written."""
    from voxrelay.checkpoint.lease import LeaseLost, RunLease

    run_uri = storage.join(s3_root, "runs", "r")
    ours = RunLease(run_uri, 60)
    ours.acquire()
    checks: list[int] = []

    def guard() -> None:
        ours.check()
        checks.append(1)
        if len(checks) == 1:  # another session takes the run over while this sync is under way
            RunLease(run_uri, 60, pause=lambda s: None).acquire(take_over=True)

    cfg = build_config({"root": s3_root, "monitor": {"tensorboard": False}}, "test")
    monitor = build_monitor(cfg, run_uri, tmp_path / "run", is_main=True, guard=guard)
    (tmp_path / "run" / "a.txt").write_text("first")
    (tmp_path / "run" / "b.txt").write_text("second")
    with pytest.raises(LeaseLost):
        monitor._copy_files()  # the sync's work, in this thread so its error is seen
    assert storage.exists(storage.join(run_uri, "a.txt")) and not storage.exists(storage.join(run_uri, "b.txt"))
