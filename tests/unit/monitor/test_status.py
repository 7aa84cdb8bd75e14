"""`voxrelay status`: local cache use, and a clear error for a folder that is not a run."""

import json
import os
import socket
import time
import uuid

import pytest
import torch

from voxrelay import storage
from voxrelay.checkpoint.host import boot_id, pid_namespace
from voxrelay.checkpoint.manager import MODEL_FILE, CheckpointManager, model_writer
from voxrelay.errors import UserError
from voxrelay.monitor.status import StatusError, format_status, run_status
from voxrelay.paths import CONFIG_SNAPSHOT


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_status_shows_local_cache_use(tmp_path, cache):
    run = f"memory://status-{uuid.uuid4().hex}/runs/r"
    storage.write_text(storage.join(run, CONFIG_SNAPSHOT), "train:\n  max_steps: 10\n")
    # a staged checkpoint the bucket never received (the uploader is gone), in the run's own staging
    mgr = CheckpointManager(run)
    mgr.start()
    mgr.uploader.close()
    ckpt = mgr.staging.stage(3, {MODEL_FILE: model_writer({"w": torch.zeros(256 * 1024)})}, {})  # 1 MiB
    staged = sum(p.stat().st_size for p in (cache / "staging").rglob("*") if p.is_file())
    (cache / "prepared" / "data-x").mkdir(parents=True)
    (cache / "prepared" / "data-x" / "train-00000.parquet").write_bytes(b"\0" * (3 << 20))
    status = run_status(run)
    assert status.cache.prepared == 3 << 20 and status.cache.staging == staged > 1 << 20
    assert status.staged_steps == [ckpt.step]
    text = format_status(status)
    assert f"local cache  4.0 MiB (prepared 3.0 MiB, staging 1.0 MiB) in {cache}" in text
    storage.delete(run.rsplit("/runs/", 1)[0], recursive=True)


def test_status_of_a_missing_or_non_run_folder_is_a_user_error(tmp_path, cache):
    missing = tmp_path / "bucket" / "runs" / "nope"
    with pytest.raises(StatusError, match=f"{missing} does not exist; pass the run folder <root>/runs/<name>"):
        run_status(str(missing))
    assert issubclass(StatusError, UserError)  # the CLI prints it and exits 2, no traceback
    (tmp_path / "bucket" / "runs" / "other").mkdir(parents=True)
    with pytest.raises(StatusError, match=f"is not a run folder \\(no {CONFIG_SNAPSHOT}\\)"):
        run_status(str(tmp_path / "bucket" / "runs" / "other"))



def test_what_limits_a_run_is_read_from_its_throughput_reports():
    from voxrelay.monitor.limits import what_limits

    fine = [{"tokens_per_sec": 100, "data_wait": 0.05, "staging_backlog": 0, "staging_free_gb": 50.0}] * 3
    assert what_limits(fine, 10**9) == [
        "nothing seen: no wait on batches or uploads (the model's compute sets the pace)"]
    assert what_limits([]) == []
    waiting = fine[:1] + [{"tokens_per_sec": 100, "data_wait": 0.4, "staging_backlog": 3, "upload_mb_s": 12.34,
                           "staging_free_gb": 1.5}] * 4
    found = what_limits(waiting, 10**9)
    assert found[0].startswith("data-bound: 33% of the time waiting for batches")  # the mean of the last 5
    assert found[1].startswith("upload-bound: 3 checkpoints staged, waiting for the bucket at 12.3 MB/s")
    assert found[2].startswith("staging disk nearly full: 1.5 GB free for checkpoints of 1.0 GB")
    assert len(what_limits(waiting, 10**8)) == 2  # 1.5 GB free is room for a 0.1 GB checkpoint
    streaming = [{"tokens_per_sec": 100, "data_wait": 0.5, "shard_mb_s": 7.25, "shards_uncached": 3,
                  "cache_free_gb": 4.5}]
    found = what_limits(streaming, None, "gs://b/prepared/ljs")
    assert found[0].startswith("data-bound: 50% of the time waiting for batches (shards from gs://b/prepared/ljs at "
                               "7.2 MB/s a stream); raise train.prefetch_batches")
    assert found[1].startswith("shard cache disk nearly full (4.5 GB free): 3 shards were read into memory")


def test_status_says_what_limits_the_run(tmp_path, cache):
    import json

    from voxrelay.paths import METRICS_FILE

    run = f"memory://status-{uuid.uuid4().hex}/runs/r"
    storage.write_text(storage.join(run, CONFIG_SNAPSHOT), "train:\n  max_steps: 10\n")
    reports = [{"step": s, "time": float(s), "tokens_per_sec": 10.0, "audio_sec_per_sec": 1.0, "data_wait": 0.5,
                "staging_backlog": 0, "staging_free_gb": 9.0} for s in (1, 2)]
    storage.write_text(storage.join(run, METRICS_FILE), "".join(json.dumps(r) + "\n" for r in reports))
    text = format_status(run_status(run))
    assert "limits       data-bound: 50% of the time waiting for batches" in text
    storage.delete(run.rsplit("/runs/", 1)[0], recursive=True)


def test_the_writer_is_judged_without_comparing_clocks(tmp_path, cache):
    """Issue 33 D2 for display: a lease written by a machine whose clock runs an hour behind ours (its
    `expires` is past by our clock) is still held as far as a one-off look can tell; released or left by a gone
    process of this machine, it is not."""
    run = f"memory://status-{uuid.uuid4().hex}/runs/r"
    storage.write_text(storage.join(run, CONFIG_SNAPSHOT), "train:\n  max_steps: 10\n")
    behind = time.time() - 3600
    lease = {"token": "t", "host": "spot-vm-7", "pid": 4242, "since": behind - 60, "renewed": behind,
             "expires": behind + 60, "ttl": 60, "seq": 17, "released": False}
    storage.write_text(storage.join(run, "lease.json"), json.dumps(lease))
    held = format_status(run_status(run))
    assert "writer       host spot-vm-7, pid 4242" in held and "renewal #17" in held, held
    storage.write_text(storage.join(run, "lease.json"), json.dumps(lease | {"released": True}))
    released = format_status(run_status(run))
    assert "writer       none (the last session, host spot-vm-7 pid 4242, released it)" in released
    gone = lease | {"host": socket.gethostname(), "boot_id": boot_id(), "pid_ns": pid_namespace(),
                    "pid": os.getpid(), "start_ticks": -1, "renewed": time.time(), "expires": time.time() + 60}
    storage.write_text(storage.join(run, "lease.json"), json.dumps(gone))
    assert "died on this machine" in format_status(run_status(run))


def test_status_last_eval_says_what_measured_each_score(tmp_path, cache):
    from voxrelay.paths import METRICS_FILE

    run = f"memory://status-{uuid.uuid4().hex}/runs/r"
    storage.write_text(storage.join(run, CONFIG_SNAPSHOT), "train:\n  max_steps: 10\n")
    evals = [{"step": 4, "time": 1.0, "eval/loss": 2.5, "eval/wer": 0.4, "eval/asr": "Whisper base",
              "eval/utmos": 3.25, "eval/mos_model": "UTMOS22 strong (w.pt)"}]
    storage.write_text(storage.join(run, METRICS_FILE), "".join(json.dumps(r) + "\n" for r in evals))
    (line,) = [x for x in format_status(run_status(run)).splitlines() if x.startswith("last eval")]
    assert line == ("last eval    loss 2.500, wer 0.400, utmos 3.250 (WER/CER by Whisper base) "
                    "(UTMOS by UTMOS22 strong (w.pt))")
    storage.delete(run.rsplit("/runs/", 1)[0], recursive=True)
