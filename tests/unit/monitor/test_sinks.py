"""Metric sinks: the JSONL sink always, and a clear user error when the wandb sink cannot start."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from voxrelay.config import build_config
from voxrelay.errors import UserError
from voxrelay.monitor.sinks import METRICS_FILE, build_monitor


def _cfg(tmp_path: Path, **monitor):
    return build_config({"root": str(tmp_path), "monitor": {"tensorboard": False, **monitor}}, "test")


def test_jsonl_sink_appends_one_object_per_step(tmp_path: Path) -> None:
    monitor = build_monitor(_cfg(tmp_path), str(tmp_path / "run"), tmp_path / "run", is_main=True)
    monitor.log(1, {"loss": 2.5})
    monitor.log(2, {"loss": 2.0})
    monitor.close()
    rows = [json.loads(line) for line in (tmp_path / "run" / METRICS_FILE).read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 2.5), (2, 2.0)]


def test_missing_wandb_is_a_user_error_naming_both_fixes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError, installed or not
    with pytest.raises(UserError) as info:
        build_monitor(_cfg(tmp_path, wandb=True), str(tmp_path / "run"), tmp_path / "run", is_main=True)
    message = str(info.value)
    assert "pip install 'voxrelay[wandb]'" in message and "monitor.wandb=false" in message
