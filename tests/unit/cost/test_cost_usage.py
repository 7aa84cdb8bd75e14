"""usage.json: sessions add up (none counted twice), a live session counts up to now, and the budget check."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from voxrelay import storage
from voxrelay.cost.config import CostConfig
from voxrelay.cost.usage import BUDGET, BudgetSpent, UsageLog, read_sessions, usage_of
from voxrelay.errors import UserError
from voxrelay.train.ranks import Ranks

EARLIER = {"id": "h:1:100", "host": "h", "pid": 1, "started": 100.0, "updated": 3700.0, "seconds": 3600.0,
           "processes": 2, "class_a": 1000, "class_b": 5000, "bytes_read": 7, "bytes_written": 11, "step": 40}


def test_sessions_add_up_each_by_its_own_clock():
    later = EARLIER | {"id": "h:2:5000", "pid": 2, "started": 5000.0, "seconds": 600.0, "processes": 1,
                       "class_a": 10, "class_b": 20}
    u = usage_of([EARLIER, later])
    assert u.process_seconds == 3600 * 2 + 600 * 1 and (u.class_a, u.class_b) == (1010, 5020)
    assert (u.bytes_read, u.bytes_written, u.processes, u.sessions) == (14, 22, 1, 2)
    # a session on a machine whose clock runs an hour ahead: its own seconds count, not our clock minus its start
    ahead = later | {"started": later["started"] + 3600, "updated": later["updated"] + 3600}
    assert usage_of([EARLIER, ahead]).process_seconds == 3600 * 2 + 600


def test_a_session_records_its_own_entry_and_the_next_adds_one(tmp_path):
    run = str(tmp_path / "runs" / "r")
    storage.write_json(storage.join(run, "usage.json"), {"sessions": [EARLIER]})
    log = UsageLog.start(run, CostConfig(gpu_hour=2.0), processes=1, main=True)
    assert log.previous == [EARLIER]
    before = storage.op_counts()
    log.record(Ranks(None, 0, 1), step=41, wait=True)
    log.record(Ranks(None, 0, 1), step=42, wait=True)  # rewrites its entry: not a third one
    sessions = read_sessions(run)
    assert [s["id"] for s in sessions] == ["h:1:100", log.session["id"]] and sessions[1]["step"] == 42
    # this process's counts since it started, which include the first record's write and the reads above
    assert sessions[1]["class_a"] >= before["class_a"] + 1
    assert json.loads((tmp_path / "runs/r/usage.json").read_text())["sessions"][0] == EARLIER
    # a second run of this very process (in-process) replaces its entry instead of adding to it
    again = UsageLog.start(run, CostConfig(), processes=1, main=True)
    assert [s["id"] for s in again.previous] == ["h:1:100"]


def test_spend_counts_gpu_hours_of_every_session_and_this_one():
    started = time.time() - 10.0  # this session started 10 s ago, on 4 processes
    log = UsageLog("memory://x", CostConfig(gpu_hour=3600.0), True, {"id": "me", "started": started, "processes": 4},
                   [EARLIER])
    counts = log.counts()
    ops = (EARLIER["class_a"] + counts["class_a"]) * 0.05 / 1e4 + (EARLIER["class_b"] + counts["class_b"]) * 0.004 / 1e4
    # $1 per process-second: the earlier session's 3600 s x 2 processes, this one's 10 s x 4
    assert log.spent() == pytest.approx(7200 + 40 + ops, abs=1.0)
    assert log.spent(10.0) - log.spent() == pytest.approx(40.0, abs=1.0)  # a next step of 10 s on 4 processes


def test_budget_refuses_a_session_until_it_is_raised():
    cost = CostConfig(gpu_hour=1.0, budget=2.5)  # the earlier session spent 2 GPU-h = $2 (+ $0.007 of requests)
    log = UsageLog("memory://run", cost, True, {"id": "me", "started": time.time(), "processes": 1},
                   [EARLIER])
    log.check_budget()  # $2.007 < $2.5: trains
    assert not log.over_budget(1.0) and log.over_budget(3600.0)  # an hour-long step would pass it
    stopped = EARLIER | {"stopped": BUDGET, "budget": 2.5}  # the last session stopped at this very budget
    log.previous = [stopped]
    with pytest.raises(BudgetSpent, match=r"raise cost.budget \(e.g. cost.budget=5\) to train on"):
        log.check_budget()
    assert issubclass(BudgetSpent, UserError)  # exit 2, the message, no traceback
    log.cost = CostConfig(gpu_hour=1.0, budget=3.0)  # raised: trains on
    log.check_budget()
    log.cost = CostConfig(gpu_hour=1.0, budget=2.0)  # spent: refused whatever stopped the last session
    log.previous = [EARLIER]
    with pytest.raises(BudgetSpent, match=r"training has spent \$2.0\d+ of cost.budget=\$2 by the estimate"):
        log.check_budget()


def test_status_cost_stays_light_and_says_when_nothing_was_recorded(tmp_path):
    """`status --cost` reads JSON/YAML only (no torch: it answers at once); a run without usage.json says so."""
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("train: {max_steps: 5}\ncost: {gpu_hour: 1.0}\n")
    probe = ("import runpy, sys\nsys.argv = ['voxrelay', 'status', sys.argv[1], '--cost']\n"
             "try:\n    runpy.run_module('voxrelay', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "print([m for m in ('torch', 'transformers', 'accelerate', 'pyarrow') if m in sys.modules])")
    res = subprocess.run([sys.executable, "-c", probe, str(run)], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip().endswith("[]"), res.stdout + res.stderr
    assert "no usage recorded yet (usage.json is written by `voxrelay train`" in " ".join(res.stdout.split())
    assert "  gpu                 0" in res.stdout  # nothing recorded: no GPU time
