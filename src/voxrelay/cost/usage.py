"""Each training session's usage, kept in ``<run>/usage.json`` so that what a run costs adds up over sessions.

One entry per session (rank 0's process and its job; id: host, pid, process start): the seconds since its
process started, its processes, and the storage requests and bytes of all its processes
(:mod:`voxrelay.storage.counters`, gathered at every checkpoint and at the end). A session rewrites its own
entry only (its lease makes it the run's one writer), so resumed sessions add up and nothing is counted
twice. The entry is written when the session starts (its lease taken, before weights and data load) and
renewed as training makes progress (every third of ``checkpoint.lease_seconds``, with the lease), so a
session killed hard — even before its first save, as in a crash loop — keeps what it last recorded and
counts against ``cost.budget``. ``--fresh`` deletes the
file with the checkpoints and metrics.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from voxrelay import storage
from voxrelay.checkpoint import stops
from voxrelay.checkpoint.preemption import process_start_time
from voxrelay.cost.config import CostConfig
from voxrelay.cost.estimate import Usage, training_spend, usd
from voxrelay.errors import UserError
from voxrelay.paths import USAGE_FILE
from voxrelay.storage.counters import KEYS

log = logging.getLogger(__name__)

BUDGET = stops.BUDGET.reason  # the stop reason (a checkpoint manifest's "stopped", a session's entry)
SESSIONS = "sessions"


class BudgetSpent(UserError):
    """``cost.budget`` is spent: a session refuses to train until it is raised (the message says by how much)."""


def read_sessions(run_uri: str) -> list[dict]:
    """The run's session entries, oldest first; [] when it has none (a run trained before usage was recorded)."""
    uri = storage.join(run_uri, USAGE_FILE)
    if not storage.exists(uri):
        return []
    try:
        sessions = storage.read_json(uri).get(SESSIONS, [])
    except ValueError as err:  # cut short by hand, or damaged: a report, never a reason to stop
        log.warning("ignoring %s: %s", uri, err)
        return []
    return sorted((s for s in sessions if isinstance(s, dict)), key=lambda s: s.get("started", 0))


def usage_of(sessions: list[dict]) -> Usage:
    """The sum of session entries, each as its session measured it on its own clock (a live session renews its
    entry every third of its lease: no other machine's clock is compared with its start)."""
    u = Usage(sessions=len(sessions))
    for s in sessions:
        seconds = s.get("seconds", 0.0)
        u.process_seconds += seconds * s.get("processes", 1)
        u.class_a += s.get("class_a", 0)
        u.class_b += s.get("class_b", 0)
        u.bytes_read += s.get("bytes_read", 0)
        u.bytes_written += s.get("bytes_written", 0)
        u.processes = s.get("processes", 1)
    return u


def refuse_if_spent(run_uri: str, cost: CostConfig, fresh: bool = False) -> None:
    """Raise :class:`BudgetSpent` when the run's cost.budget is spent (see :meth:`UsageLog.check_budget`): torch-free,
    so `voxrelay train` refuses at once, before its heavy imports (the session's build checks again, on rank 0)."""
    if cost.budget is not None and not fresh:
        UsageLog.start(run_uri, cost, processes=1, main=True).check_budget()


class UsageLog:
    """This session's usage (every rank) and its entry in ``usage.json`` (rank 0), and the budget check."""

    def __init__(self, run_uri: str, cost: CostConfig, main: bool, session: dict, previous: list[dict],
                 guard: Callable[[], None] | None = None):
        self.run_uri = run_uri
        self.cost = cost
        self.main = main
        self.session = session  # this session's entry (its counts filled in at each record)
        self.previous = previous  # the other sessions' entries (rank 0)
        self.guard = guard  # the run's lease check: raises once another session owns the run folder
        self.others = dict.fromkeys(KEYS, 0)  # the other ranks' counts at the last record
        self.written_at = 0.0  # time.monotonic() of the last write of this session's entry
        self._thread: threading.Thread | None = None

    @classmethod
    def start(cls, run_uri: str, cost: CostConfig, processes: int, main: bool, fresh: bool = False,
              guard: Callable[[], None] | None = None) -> UsageLog:
        """This session's log; rank 0 reads the earlier sessions' entries (none with ``fresh``: they go with
        the run's checkpoints). An entry of this very process (a second run of it) is replaced, not added to."""
        started = process_start_time()
        session = {"id": f"{socket.gethostname()}:{os.getpid()}:{started:.0f}", "host": socket.gethostname(),
                   "pid": os.getpid(), "started": started, "processes": processes}
        previous = [] if fresh or not main else [s for s in read_sessions(run_uri) if s.get("id") != session["id"]]
        return cls(run_uri, cost, main, session, previous, guard)

    def counts(self) -> dict[str, int]:
        """This session's storage counts: this process's now plus the other ranks' at the last record."""
        mine = storage.op_counts()
        return {k: mine[k] + self.others[k] for k in KEYS}

    def usage(self, extra_s: float = 0.0) -> Usage:
        """The run's usage: the earlier sessions' and this one's until now (+ ``extra_s`` seconds)."""
        now = {**self.session, **self.counts(), "seconds": time.time() - self.session["started"] + extra_s}
        return usage_of([*self.previous, now])

    def spent(self, extra_s: float = 0.0) -> float:
        """USD training has spent on the run (what cost.budget counts), ``extra_s`` more seconds included."""
        return sum(training_spend(self.usage(extra_s), self.cost).values())

    def over_budget(self, step_s: float) -> bool:
        """Rank 0: the spend would pass cost.budget by the end of a next step lasting ``step_s``."""
        return self.main and self.cost.budget is not None and self.spent(step_s) >= self.cost.budget

    def check_budget(self) -> None:
        """Rank 0, before anything is built: raise :class:`BudgetSpent` when the earlier sessions spent cost.budget, or
        when the last one stopped at a budget this one does not raise."""
        budget = self.cost.budget
        if budget is None or not self.main:
            return
        last = self.previous[-1] if self.previous else {}
        stopped = last.get("stopped") == BUDGET and last.get("budget", 0) >= budget
        spent = sum(training_spend(usage_of(self.previous), self.cost).values())  # as status shows it
        if spent >= budget or stopped:
            why = "" if spent >= budget else f"the last session stopped at cost.budget=${budget:g}: "
            raise BudgetSpent(f"{self.run_uri}: {why}{self.stop_message(spent)}. Nothing was trained in this session")

    def stop_message(self, spent: float | None = None) -> str:
        spent = self.spent() if spent is None else spent
        return (f"training has spent ${usd(spent)} of cost.budget=${self.cost.budget:g} by the estimate; raise "
                f"cost.budget (e.g. cost.budget={2 * self.cost.budget:g}) to train on; `voxrelay status "
                f"{self.run_uri} --cost` itemises it")

    def record(self, ranks, step: int, stopped: str | None = None, write: bool = True, wait: bool = False) -> None:
        """Every rank (a collective): gather the storage counts; rank 0 writes this session's entry (in a thread
        unless ``wait``; not at all unless ``write``, e.g. once the run was taken over)."""
        gathered = ranks.gather(storage.op_counts())
        if not self.main:
            return
        self.others = {k: sum(c[k] for c in gathered[1:]) for k in KEYS}
        now = time.time()
        self.session.update(self.counts(), seconds=now - self.session["started"], updated=now, step=step)
        if stopped is not None:
            self.session.update(stopped=stopped, budget=self.cost.budget)
        if write:
            self._submit(wait)

    def heartbeat(self, step: int | None = None, every_s: float = 0.0) -> None:
        """Rank 0, no collective: write this session's entry as it stands (its seconds so far, this process's
        counts, the other ranks' as last gathered) when ``every_s`` have passed since the last write. Called at
        the session's start (``every_s`` 0: at once, and waited for) and at each step's end, so a session killed
        before its first save still counts."""
        if not self.main or time.monotonic() - self.written_at < every_s:
            return
        now = time.time()
        self.session.update(self.counts(), seconds=now - self.session["started"], updated=now)
        if step is not None:
            self.session["step"] = step
        self._submit(wait=every_s == 0)

    def _submit(self, wait: bool) -> None:
        self.written_at = time.monotonic()
        doc = {SESSIONS: [*self.previous, dict(self.session)]}
        if self._thread is not None and self._thread.is_alive():
            if not wait:
                return  # the next record writes it
            self._thread.join()
        self._thread = threading.Thread(target=self._write, args=(doc,), name="voxrelay-usage", daemon=True)
        self._thread.start()
        if wait:
            self._thread.join()

    def _write(self, doc: dict) -> None:
        try:
            if self.guard is not None:
                self.guard()
            storage.write_json(storage.join(self.run_uri, USAGE_FILE), doc)
        except Exception as err:  # noqa: BLE001 (a report, never a reason to stop: the next record writes it again)
            log.warning("could not record this session's usage in %s (%s); will retry at the next checkpoint",
                        self.run_uri, err)
