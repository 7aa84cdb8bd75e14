"""prepare output, checkpoints and synthesis with the root on S3 and GCS test servers (127.0.0.1)."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from tests.helpers.tiny import tiny
from voxrelay import storage
from voxrelay.cli import app, demo_config_path

runner = CliRunner()


@pytest.mark.parametrize("root_fixture", ["s3_root", "gcs_root"])
def test_pipeline_on_object_storage(root_fixture, request, tmp_path, monkeypatch):
    root = request.getfixturevalue(root_fixture)
    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    args = tiny(root, "train.max_steps=4", "train.eval_every=4")
    for cmd in ("prepare", "train"):
        res = runner.invoke(app, [cmd, str(demo_config_path()), *args], catch_exceptions=False)
        assert res.exit_code == 0, res.output
    prepared = storage.join(root, "prepared", "demo")
    assert storage.exists(storage.join(prepared, "index.json"))
    assert any(n.endswith(".parquet") for n in storage.listdir(storage.join(prepared, "shards")))
    run = storage.join(root, "runs", "demo")
    assert storage.listdir(storage.join(run, "checkpoints")) == ["step-00000002", "step-00000004"]
    assert "manifest.json" in storage.listdir(storage.join(run, "checkpoints", "step-00000004"))
    assert storage.exists(storage.join(run, "metrics.jsonl"))
    out = tmp_path / "out.wav"
    res = runner.invoke(app, ["synthesize", run, "on a bucket", "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    wav, _ = sf.read(out)
    assert len(wav) > 0 and np.isfinite(wav).all()
