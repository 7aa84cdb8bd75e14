"""Seed 000's workflow, literally: every session is a fresh VM (a new, empty $VOXRELAY_CACHE) that
re-runs the notebook's cells — `prepare`, then `train` with a per-session `train.time_limit` — and
some sessions die by SIGKILL. The run finishes, and its final weights equal an uninterrupted run's."""

from __future__ import annotations

import math
import random
import signal
import time

import pytest

from tests.helpers.runner import CONFIG, Trainer, assert_same_weights, env_for, final_weights, voxrelay
from tests.helpers.tiny import NO_EVALS, tiny
from voxrelay import storage
from voxrelay.checkpoint.stops import EXIT_TIME_LIMIT

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

STEPS = 240
# dropout > 0: the RNG state must really be restored; saves every 5 steps, no evals (speed)
ARGS = (f"train.max_steps={STEPS}", "model.dropout=0.1", "checkpoint.every_steps=5", NO_EVALS,
        "train.log_every=1")


def test_sessions_with_prepare_time_limits_and_kills_finish_like_one_run(tmp_path):
    root = str(tmp_path / "root")
    ref_env = env_for(tmp_path / "cache-reference")
    res = voxrelay("prepare", CONFIG, *tiny(root), env=ref_env)
    assert res.returncode == 0, res.stdout + res.stderr
    limit = _session_limit(Trainer(root, ref_env, "name=reference", *ARGS))

    rng = random.Random(7)
    outcomes: list[str] = []
    for session in range(14):
        env = env_for(tmp_path / f"cache-{session}")  # a new VM: nothing local survives
        res = voxrelay("prepare", CONFIG, *tiny(root), env=env)
        assert res.returncode == 0 and "shards written 0" in res.stdout, res.stdout + res.stderr
        # imports count against the limit (the clock starts with the process): each session gets a few seconds of steps
        trainer = Trainer(root, env, "name=sessions", f"train.time_limit={limit}s", *ARGS)
        if session % 3 == 1:  # this VM dies without notice at some point after training started
            assert trainer.first_step.wait(120), trainer.output()
            time.sleep(rng.uniform(0.2, 2.0))
            trainer.proc.send_signal(signal.SIGKILL)
        code = trainer.proc.wait(timeout=300)
        outcomes.append({0: "finished", EXIT_TIME_LIMIT: "time limit", -signal.SIGKILL: "killed"}.get(code, str(code)))
        assert code in (0, EXIT_TIME_LIMIT, -signal.SIGKILL), trainer.output()
        if code == 0:
            break
    assert outcomes[-1] == "finished", outcomes
    # (a host whose load drops after the reference ran needs fewer sessions: one time limit is still one)
    assert outcomes.count("time limit") >= 1 and "killed" in outcomes and len(outcomes) >= 3, outcomes
    step_a, a = final_weights(storage.join(root, "runs", "reference"), tmp_path / "fetch")
    step_b, b = final_weights(storage.join(root, "runs", "sessions"), tmp_path / "fetch")
    assert step_a == step_b == STEPS
    assert_same_weights(a, b)
    print(f"sessions: {outcomes}")


def _session_limit(reference: Trainer) -> int:
    """A per-session time limit for this host (hosts differ up to 3x): the reference run's start-up (imports to
    its first step) plus a fifth of its training time, so that sessions train part of the run each and the
    run needs several of them; never under 13 s."""
    t0 = time.monotonic()
    assert reference.first_step.wait(300), reference.output()
    startup = time.monotonic() - t0
    assert reference.proc.wait(timeout=900) == 0, reference.output()
    training = time.monotonic() - t0 - startup
    return max(13, math.ceil(1.3 * startup + training / 5))
