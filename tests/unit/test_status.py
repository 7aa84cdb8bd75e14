"""`voxrelay status`: local cache use, and a clear error for a folder that is not a run."""

import uuid

import pytest
import torch

from voxrelay import storage
from voxrelay.checkpoint.manager import MODEL_FILE, CheckpointManager, model_writer
from voxrelay.errors import UserError
from voxrelay.paths import CONFIG_SNAPSHOT
from voxrelay.status import StatusError, format_status, run_status


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

