"""Why a session stops, with one home (voxrelay.checkpoint.stops): the exit code of every stop, durable or not,
refused or not; the severity order the processes of a job agree by; the sweep's verdicts; the exit-code page's table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from voxrelay.checkpoint import stops as S

EXIT_CODES = Path(__file__).parents[3] / "docs" / "reference" / "exit-codes.md"


@pytest.mark.parametrize(("reason", "durable", "refused", "code"), [
    (None, True, False, 0),  # train.max_steps
    (None, False, False, 76),  # the end, but the last upload did not finish
    ("early stopping", True, False, 0),
    ("SIGTERM", True, False, 75),
    ("gcp preemption notice", False, False, 76),
    ("train.time_limit", True, False, 77),
    ("train.total_time_limit", True, False, 77),
    ("cost.budget", True, False, 77),
    ("train.time_limit", False, False, 76),
    ("non-finite steps", True, False, 78),
    ("out of memory", True, False, 79),
    ("storage error", False, False, 74),  # final on any machine, staged or not
    ("checkpoint.max_failed_saves", False, False, 74),
    ("SIGTERM", False, True, 74),  # the bucket refused an upload: a new machine meets it too
    ("the run was taken over by another session", False, False, 2),
])
def test_each_stop_has_its_exit_code(reason, durable, refused, code):
    assert S.exit_code(reason, durable, refused) == code


def test_a_lost_lease_outranks_a_signal_which_outranks_everything_else():
    from voxrelay.train.stops import severity

    order = sorted([*S.STOPS, "SIGINT"], key=severity)
    assert order[:2] == [S.LEASE_LOST.reason, "SIGINT"]
    assert order[2:] == [s.reason for s in sorted(S.STOPS.values(), key=lambda s: s.severity)][1:]
    assert len({s.severity for s in S.STOPS.values()}) == len(S.STOPS)  # no ties: every rank picks the same


def test_a_sweep_ends_exactly_the_experiments_a_rerun_cannot_continue():
    from voxrelay.sweep import state

    assert state._FINAL_STOPS == {"early stopping": state.EARLY_STOPPED, "train.total_time_limit": state.STOPPED,
                                  "cost.budget": state.STOPPED}
    assert all(not s.again for s in S.STOPS.values() if s.sweep_state)
    assert S.TIME_LIMIT.again and S.preemption("SIGTERM").again


def test_the_exit_code_page_lists_every_code_a_session_can_end_with():
    text = EXIT_CODES.read_text()
    table = text[text.index("| exit code | meaning | what to do |"):]
    table = table[:table.index("\n\n")]
    listed = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)}
    codes = {s.exit_code for s in S.STOPS.values()} | {S.EXIT_PREEMPTED, S.EXIT_PREEMPTED_STAGED, S.EXIT_ABORTED}
    assert listed == codes | {S.EXIT_OK}
