"""Deadlines and bounded waits: `train.time_limit` is per session (a Colab notebook re-run the next
day trains a whole session again), `train.total_time_limit` is a budget over sessions, a dead or
missing bucket never hangs a run, and keep_best keeps the best evaluated weights whatever the intervals."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest

from tests.helpers.runner import CONFIG, Trainer, env_for, final_weights, session_seconds, voxrelay
from tests.helpers.tiny import NO_EVALS, NO_SAVES, tiny
from voxrelay import storage
from voxrelay.checkpoint.stops import EXIT_PREEMPTED_STAGED, EXIT_TIME_LIMIT

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

ENDLESS = ("train.max_steps=100000", NO_SAVES, NO_EVALS)


def _steps(stderr: str) -> int:
    return int(re.search(r"stopped at step (\d+)", " ".join(stderr.split())).group(1))


def test_time_limit_is_per_session_and_total_limit_spans_sessions(tmp_path):
    root, env = str(tmp_path / "root"), env_for(tmp_path / "cache")
    assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
    # the first session trains 2 steps and finishes, measuring this host; a session is then twice that plus 5 s:
    # start-up (imports count: the clock starts with the process) and steps, on a slow host as on a fast one
    limit = math.ceil(2 * session_seconds(tiny(root), env)) + 5
    session = (f"train.time_limit={limit}s", *ENDLESS)
    first = voxrelay("train", CONFIG, *tiny(root, *session), env=env)
    assert first.returncode == EXIT_TIME_LIMIT, first.stderr
    assert "train.time_limit" in first.stderr and "checkpoint committed" in first.stderr
    after_first = _steps(first.stderr)
    assert after_first > 2
    # the next session gets a whole session again (it used to stop after one step: the limit was cumulative)
    second = voxrelay("train", CONFIG, *tiny(root, *session), env=env)
    assert second.returncode == EXIT_TIME_LIMIT, second.stderr
    after_second = _steps(second.stderr)
    assert after_second > after_first + 1, (after_first, after_second)
    assert final_weights(storage.join(root, "runs", "demo"), tmp_path / "fetch")[0] == after_second
    # a total budget already spent by the two sessions: the third stops before training any step
    third = voxrelay("train", CONFIG, *tiny(root, "train.total_time_limit=2s", *ENDLESS), env=env)
    assert third.returncode == EXIT_TIME_LIMIT, third.stderr
    assert "train.total_time_limit" in third.stderr and _steps(third.stderr) == after_second


def test_dead_bucket_at_the_end_exits_76_with_the_staged_path(tmp_path, s3_root, s3_server):
    env = env_for(tmp_path / "cache") | {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    env |= {"AWS_MAX_ATTEMPTS": "1", "VOXRELAY_RETRY_ATTEMPTS": "1"}
    assert voxrelay("prepare", CONFIG, *tiny(s3_root), env=env).returncode == 0
    trainer = Trainer(s3_root, env, "name=dead", "train.max_steps=40", NO_SAVES,
                      NO_EVALS, "train.log_every=1", "checkpoint.final_upload_timeout=3")
    assert trainer.first_step.wait(120), trainer.output()
    s3_server.stop()  # the bucket is gone until the end of the run: the last upload can never finish
    try:
        code = trainer.proc.wait(timeout=300)  # bounded: it used to wait for ever
    finally:
        s3_server.start()
    out = " ".join(trainer.output().split())
    assert code == EXIT_PREEMPTED_STAGED, trainer.output()
    staged = re.search(r"only on this machine, at (\S+)", out).group(1)
    assert Path(staged).name == "step-00000040" and (Path(staged) / "manifest.json").exists()


@pytest.mark.parametrize("command", ["prepare", "train"])
def test_missing_bucket_fails_fast_naming_it(tmp_path, s3_root, command):
    env = env_for(tmp_path / "cache") | {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    res = voxrelay(command, CONFIG, *tiny("s3://no-such-bucket-vr/run"), env=env, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    msg = " ".join(res.stderr.split())
    assert "bucket s3://no-such-bucket-vr (of root s3://no-such-bucket-vr/run) does not exist" in msg
    assert "aws s3 mb s3://no-such-bucket-vr" in msg


def test_keep_best_keeps_the_best_eval_when_intervals_differ(tmp_path):
    """Evaluations every 2 steps and saves every 3: the best evaluated weights are still kept."""
    root, env = str(tmp_path / "root"), env_for(tmp_path / "cache")
    assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
    # a learning rate that warms up far too high: the eval loss gets worse after its first evaluation
    args = ("train.max_steps=10", "train.eval_every=2", "checkpoint.every_steps=3", "checkpoint.keep_best=true",
            "train.lr=3", "train.warmup_steps=10", "train.clip_norm=null", "train.eval_synth=0")
    res = voxrelay("train", CONFIG, *tiny(root, *args), env=env)
    assert res.returncode == 0, res.stderr
    run = tmp_path / "root/runs/demo"
    evals = {m["step"]: m["eval/loss"] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if "eval/loss" in m and m["step"] > 0}
    best = min(evals, key=evals.get)
    assert best not in (9, 10), evals  # else keep_last alone would keep it and the test proves nothing
    kept = {int(p.name[5:]): json.loads((p / "manifest.json").read_text()) for p in (run / "checkpoints").iterdir()}
    assert best in kept, (evals, sorted(kept))
    assert kept[best]["metrics"]["eval/loss"] == pytest.approx(evals[best])
    assert sorted(kept) == sorted({9, 10, best})  # keep_last=2 plus the best
