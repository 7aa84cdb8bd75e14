"""The bucket goes away mid-run: training goes on, checkpoints stay staged, and once the server is
back the upload completes. A signal makes the run save, wait for the upload and exit with its code."""

from __future__ import annotations

import os
import re
import signal
import time

from tests.integration.runner import CONFIG, Trainer, env_for, final_weights, voxrelay
from tests.integration.tiny import tiny
from voxrelay import storage
from voxrelay.checkpoint.preemption import EXIT_PREEMPTED

LONG = ("train.max_steps=250", "train.eval_every=1000", "checkpoint.every_steps=25", "train.log_every=5")


def _env(tmp_path, fast_fail: bool = True) -> dict:
    env = env_for(tmp_path / "cache")
    env |= {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "STORAGE_EMULATOR", "GCSFS_"))}
    if fast_fail:  # fail fast while the server is down (voxrelay's uploader keeps retrying)
        env |= {"AWS_MAX_ATTEMPTS": "1", "VOXRELAY_RETRY_ATTEMPTS": "1"}
    return env


def _last_step(trainer: Trainer) -> int:
    steps = [int(m.group(1)) for m in map(re.compile(r"^step (\d+)/").match, trainer.lines) if m]
    return steps[-1] if steps else 0


def test_s3_outage_during_training(tmp_path, s3_root, s3_server):
    env = _env(tmp_path)
    res = voxrelay("prepare", CONFIG, *tiny(s3_root), env=env)
    assert res.returncode == 0, res.stderr
    trainer = Trainer(s3_root, env, "name=outage", *LONG)
    assert trainer.first_step.wait(120), trainer.output()
    s3_server.stop()
    try:
        time.sleep(2)
        during = _last_step(trainer)
        time.sleep(3)
        assert _last_step(trainer) > during, trainer.output()  # training never stopped
        assert trainer.proc.poll() is None or "upload of step" in trainer.output()
    finally:
        s3_server.start()  # an empty bucket again: moto keeps nothing across restarts
    assert trainer.proc.wait(timeout=300) == 0, trainer.output()
    out = trainer.output()
    assert "failed" in out and "training goes on" in out
    step, weights = final_weights(storage.join(s3_root, "runs", "outage"), tmp_path / "fetch")
    assert step == 250 and weights


def test_sigterm_saves_uploads_and_exits_with_code(tmp_path, gcs_root):
    env = _env(tmp_path, fast_fail=False)
    res = voxrelay("prepare", CONFIG, *tiny(gcs_root), env=env)
    assert res.returncode == 0, res.stderr
    trainer = Trainer(gcs_root, env, "name=term", "train.max_steps=100000", "checkpoint.every_steps=100000",
                      "train.eval_every=100000", "train.log_every=1")
    assert trainer.first_step.wait(120), trainer.output()
    time.sleep(0.5)
    trainer.proc.send_signal(signal.SIGTERM)
    assert trainer.proc.wait(timeout=120) == EXIT_PREEMPTED, trainer.output()
    out = trainer.output()
    assert "SIGTERM received" in out and "checkpoint committed" in out
    step, _ = final_weights(storage.join(gcs_root, "runs", "term"), tmp_path / "fetch")
    assert step == _last_step(trainer) and step > 0
    # and the next session resumes from it
    res = voxrelay("train", CONFIG, *tiny(gcs_root, "name=term", f"train.max_steps={step + 2}",
                                          "checkpoint.every_steps=100000", "train.eval_every=100000"), env=env)
    assert res.returncode == 0 and f"resuming {storage.join(gcs_root, 'runs', 'term')} from step {step}" in res.stderr


def test_time_limit_saves_and_exits_cleanly(tmp_path):
    from voxrelay.checkpoint.preemption import EXIT_TIME_LIMIT

    root = str(tmp_path / "root")
    env = _env(tmp_path, fast_fail=False)
    assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
    res = voxrelay("train", CONFIG, *tiny(root, "train.max_steps=100000", "train.time_limit=2s",
                                          "checkpoint.every_steps=100000", "train.eval_every=100000"), env=env)
    assert res.returncode == EXIT_TIME_LIMIT, res.stderr
    assert "train.time_limit" in res.stderr
    step, _ = final_weights(storage.join(root, "runs", "demo"), tmp_path / "fetch")
    assert 0 < step < 100000
    # the limit counts training time over sessions: a new session stops again at once
    res = voxrelay("train", CONFIG, *tiny(root, "train.max_steps=100000", "train.time_limit=2s",
                                          "checkpoint.every_steps=100000", "train.eval_every=100000"), env=env)
    assert res.returncode == EXIT_TIME_LIMIT
    assert final_weights(storage.join(root, "runs", "demo"), tmp_path / "fetch")[0] == step + 1


def test_second_sigint_aborts_at_once_and_leaves_no_broken_checkpoint(tmp_path):
    from voxrelay.checkpoint.manager import CheckpointManager
    from voxrelay.checkpoint.preemption import EXIT_ABORTED

    root = str(tmp_path / "root")
    env = _env(tmp_path, fast_fail=False)
    assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
    # a bigger model, so that the emergency save and upload take a moment to interrupt
    trainer = Trainer(root, env, "train.max_steps=100000", "checkpoint.every_steps=3", "train.eval_every=100000",
                      "train.log_every=1", "model.hidden_size=256", "model.num_layers=4", "model.intermediate_size=768")
    assert trainer.first_step.wait(120), trainer.output()
    ckpts = tmp_path / "root/runs/demo/checkpoints"
    deadline = time.time() + 60
    while not list(ckpts.glob("*/manifest.json")) and time.time() < deadline:
        time.sleep(0.05)
    trainer.proc.send_signal(signal.SIGINT)
    deadline = time.time() + 30
    while "SIGINT received" not in trainer.output() and time.time() < deadline:
        time.sleep(0.005)
    trainer.proc.send_signal(signal.SIGINT)
    assert trainer.proc.wait(timeout=60) == EXIT_ABORTED, trainer.output()
    assert "second SIGINT" in trainer.output()
    mgr = CheckpointManager(storage.join(root, "runs", "demo"), staging_dir=tmp_path / "cache" / "fetch")
    committed = mgr.store.list()
    assert committed
    for ckpt in committed:  # every committed checkpoint is whole
        assert mgr.latest_valid(ckpt.step)[0].step == ckpt.step
