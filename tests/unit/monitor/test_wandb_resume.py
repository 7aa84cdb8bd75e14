"""Every session of a run logs to the same W&B run (issue 32 item 7): its id is kept in the run folder, so a
new session on another machine (a Colab runtime, a spot VM) resumes that W&B run instead of opening a new one.
wandb itself, offline (WANDB_MODE=offline writes the runs under WANDB_DIR)."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxrelay import storage
from voxrelay.config import build_config
from voxrelay.monitor.sinks import WANDB_RUN_FILE, WandbSink, build_monitor

pytest.importorskip("wandb")


def _session(run_uri: str, machine: Path) -> str:
    cfg = build_config({"root": str(machine), "monitor": {"tensorboard": False, "wandb": True}}, "test")
    monitor = build_monitor(cfg, run_uri, machine / "run", is_main=True)
    sink = next(s for s in monitor.sinks if isinstance(s, WandbSink))
    monitor.log(1, {"loss": 1.0})
    run_id = sink.run.id
    monitor.close()
    return run_id


def test_each_session_resumes_the_same_wandb_run(memory_root: str, tmp_path: Path, monkeypatch) -> None:
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    run_uri = storage.join(memory_root, "runs", "test")
    first = _session(run_uri, tmp_path / "machine-1")
    second = _session(run_uri, tmp_path / "machine-2")  # a new machine: nothing local carried over
    assert second == first
    assert storage.read_json(storage.join(run_uri, WANDB_RUN_FILE))["id"] == first
    assert list((tmp_path / "wandb").glob(f"offline-run-*-{first}"))  # wandb's own record of that run
