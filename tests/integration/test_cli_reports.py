"""What the CLI tells a user about a run: the voices it knows, and that an early-stopped run is finished."""

from __future__ import annotations

from tests.integration.runner import CONFIG, env_for, voxrelay
from tests.integration.tiny import tiny


def test_voices_and_early_stopping_status(tmp_path):
    root, env = str(tmp_path / "root"), env_for(tmp_path / "cache")
    assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
    # a learning rate that warms up far too high: the eval loss gets worse after its first evaluation
    res = voxrelay("train", CONFIG, *tiny(root, "train.max_steps=40", "train.eval_every=2", "train.lr=3",
                                          "train.warmup_steps=10", "train.clip_norm=null", "train.eval_synth=0",
                                          "train.early_stopping_patience=1"), env=env)
    assert res.returncode == 0, res.stderr
    run = f"{root}/runs/demo"
    status = voxrelay("status", run, env=env).stdout
    assert "steps        4 of 40" in status and "finished     yes (early stopping)" in status, status

    voices = voxrelay("voices", run, env=env)
    assert voices.returncode == 0 and voices.stdout.split() == ["en-gb+f3", "en-us"]
    assert voxrelay("export", run, "-o", str(tmp_path / "exp"), env=env).returncode == 0
    assert voxrelay("voices", str(tmp_path / "exp"), env=env).stdout.split() == ["en-gb+f3", "en-us"]
    bad = voxrelay("voices", str(tmp_path), env=env)
    assert bad.returncode == 2 and "neither a run folder" in bad.stderr and "Traceback" not in bad.stderr
