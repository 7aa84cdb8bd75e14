"""Why a run stops, and the one decision all processes of a job take together after each step.

Each process has its own reasons to stop — a signal or a preemption notice it received, its clock
past ``train.time_limit``, (rank 0) a storage error, a lost lease, saves that keep failing — and
rank 0 alone decides whether a periodic save is due (its clock, its measured save cost). Deciding
apart, ranks would disagree at a step: some would enter the save's collectives, others the next
step (a hang until the NCCL timeout). So every step the processes exchange their views
(:meth:`Stops.agree`, one small gather over the job's gloo group) and all take the same decision:
the most serious reason of any rank (a lost lease, then a signal or notice, then storage, failing
saves, time limits, the cost budget, non-finite steps, early stopping), rank 0's save decision, and the time of the
earliest notice (``checkpoint.grace_seconds`` counts from it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from voxrelay.checkpoint import preemption as pre
from voxrelay.checkpoint import stops as S
from voxrelay.checkpoint.stops import is_preemption  # noqa: F401 (the loop's)

# the reasons, as the processes exchange them (voxrelay.checkpoint.stops has each one's exit code and meaning)
TIME_LIMIT, TOTAL_TIME_LIMIT, EARLY_STOP = S.TIME_LIMIT.reason, S.TOTAL_TIME_LIMIT.reason, S.EARLY_STOP.reason
NON_FINITE, STORAGE, OUT_OF_MEMORY = S.NON_FINITE.reason, S.STORAGE.reason, S.OUT_OF_MEMORY.reason
LEASE_LOST, SAVES_FAILED, BUDGET = S.LEASE_LOST.reason, S.SAVES_FAILED.reason, S.BUDGET.reason


def severity(reason: str) -> int:
    """Lower is more serious; a signal or notice ranks right after a lost lease."""
    return S.stop_of(reason).severity


@dataclass(frozen=True)
class Decision:
    stop: str | None = None  # why every process stops after this step (None: go on)
    save: bool = False  # a save is due: rank 0's trigger, or its eval found the best weights so far (keep_best)
    notice_age: float | None = None  # seconds since the earliest signal or notice on any process, when decided
    decided_at: float = field(default_factory=time.monotonic)  # this process's clock

    @property
    def preempted(self) -> bool:
        return is_preemption(self.stop)


class Stops:
    """This process's reasons to stop, agreed with the others' (see the module docstring)."""

    def __init__(self, run, watcher: pre.PreemptionWatcher, deadline: pre.Deadline, trigger: pre.SaveTrigger):
        self.run = run
        self.watcher = watcher
        self.deadline = deadline
        self.trigger = trigger

    def local(self, step_s: float) -> str | None:
        """This process's own reason to stop before another step lasting ``step_s``, if any."""
        run, loop, patience = self.run, self.run.loop, self.run.cfg.train.early_stopping_patience
        health = run.checkpoints.health()
        if run.lease is not None and run.lease.lost:
            return LEASE_LOST
        if self.watcher.stop_reason:
            return self.watcher.stop_reason
        if health.fatal is not None:
            return STORAGE
        if health.failed_saves >= run.cfg.checkpoint.max_failed_saves:
            return SAVES_FAILED
        reached = self.deadline.reached(loop.wall_time, step_s)
        if reached:
            return reached
        if run.usage is not None and run.usage.over_budget(step_s):  # rank 0's estimate (cost.budget)
            return BUDGET
        if loop.bad_in_a_row >= run.cfg.train.max_bad_steps:
            return NON_FINITE
        if patience is not None and loop.evals_since_best >= patience:
            return EARLY_STOP
        return None

    def agree(self, step_s: float, saving: bool = True, best: bool = False) -> Decision:
        """The decision of every process after this step (a collective: all call it at the same point).
        ``saving``: ask rank 0's trigger whether a periodic save is due; ``best``: this rank's eval found the
        best weights so far (rank 0's counts: evals may differ in the last bit between GPUs)."""
        ranks, noticed = self.run.ranks, self.watcher.noticed_at
        due = saving and ranks.main and (best or self.trigger.due(self.run.loop.step, self.run.stream.cursor.epoch))
        # each process's own clock only measures its own notice's age: clocks of several hosts may disagree
        views = ranks.gather((self.local(step_s), due, None if noticed is None else time.time() - noticed))
        reasons = [reason for reason, _, _ in views if reason]
        ages = [age for _, _, age in views if age is not None]
        return Decision(min(reasons, key=severity) if reasons else None, views[0][1], max(ages, default=None))

    def grace_left(self, decision: Decision) -> float:
        """Seconds of ``checkpoint.grace_seconds`` left, counted from the earliest notice."""
        grace = self.run.cfg.checkpoint.grace_seconds
        if decision.notice_age is None:
            return grace
        return max(0.0, grace - decision.notice_age - (time.monotonic() - decision.decided_at))
