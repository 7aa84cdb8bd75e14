"""(issue 33 W3) A crash loop is counted against cost.budget: a session's usage entry is written when it starts
and renewed as it trains, so sessions killed before their first save still add up, and the budget refuses the
next one (it used to count only sessions that reached a save: a loop of crashes trained for ever)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.runner import CONFIG, Trainer, env_for, voxrelay
from tests.helpers.tiny import NO_EVALS, NO_SAVES, tiny
from voxrelay import storage
from voxrelay.cost.config import CostConfig
from voxrelay.cost.estimate import training_spend
from voxrelay.cost.usage import read_sessions, usage_of

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

PRICE = ["cost.gpu_hour=3600"]  # $1 per process-second: the spend is the seconds the sessions recorded


def _killed_before_its_first_save(root: str, env: dict, run: str, sessions_before: int) -> None:
    trainer = Trainer(root, env, "name=loop", "train.max_steps=100000", NO_SAVES,
                      NO_EVALS, "train.log_every=1", "checkpoint.lease_seconds=3", *PRICE,
                      "cost.budget=1000000")
    try:  # killed once its entry was renewed by training (step 2 on), as a crash would hit it mid-run
        while not any(s.get("step", 0) >= 2 for s in read_sessions(run)[sessions_before:]):
            seen = len(trainer.steps())  # the entry is renewed every lease_seconds/3 = 1 s: long before step 1000
            assert seen < 1000 and trainer.proc.poll() is None and trainer.wait_step_lines(seen + 1, 120), \
                trainer.output()[-2000:]
    finally:
        trainer.kill()
    assert not list(Path(run).glob("checkpoints/*/manifest.json")), "a save came first: the test proves nothing"


def test_sessions_killed_before_their_first_save_count_and_the_budget_stops_the_next(tmp_path):
    root, env = str(tmp_path / "root"), env_for(tmp_path / "cache")
    run = storage.join(root, "runs", "loop")
    assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
    _killed_before_its_first_save(root, env, run, 0)
    _killed_before_its_first_save(root, env, run, 1)
    sessions = read_sessions(run)
    assert len(sessions) == 2 and all(s["seconds"] > 0 for s in sessions), sessions
    spent = sum(training_spend(usage_of(sessions), CostConfig(gpu_hour=3600)).values())
    refused = voxrelay("train", CONFIG, *tiny(root, "name=loop", *PRICE, f"cost.budget={spent * 0.9:.3f}"), env=env)
    msg = " ".join(refused.stderr.split())
    assert refused.returncode == 2 and "cost.budget" in msg and "Nothing was trained" in msg, refused.stderr
