"""``voxrelay sweep SWEEP.yaml``: one worker of a sweep. It trains the experiments one after another, each a
`voxrelay train` child process (its GPU memory is freed between experiments; a SIGKILLed worker takes its
child with it), skipping the ended ones and the ones another machine trains now, resuming the interrupted
ones, and waits while others still train so that an experiment whose machine died (its lease expired) is
resumed here. Any number of workers, on any machines, may run one sweep; re-running the command in a new
session goes on where the last one stopped.

Exit code: 0 once every experiment has ended; 1 when one failed (`sweep status` shows why; ``--retry-failed``
tries again); a preempted or time-limited session exits with the training's own code (75, 76, 77). A child's
permanent failure (74) is the experiment's failure, recorded like a crash; an experiment started
:data:`~voxrelay.sweep.state.MAX_UNSEEN_ENDS` times in a row whose end no worker saw (its machine went down with
it) is recorded as failed too, so a new VM does not pick it first for ever.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from voxrelay import storage
from voxrelay.checkpoint import preemption as pre
from voxrelay.checkpoint import stops
from voxrelay.checkpoint.host import set_parent_death_signal
from voxrelay.checkpoint.lease import LeaseWatch, check_root_for_leases, read_lease
from voxrelay.config import ConfigError, load_config
from voxrelay.paths import LEASE_FILE
from voxrelay.storage.mounts import root_mount
from voxrelay.sweep import state as st
from voxrelay.sweep.spec import Sweep, SweepError
from voxrelay.train.config import parse_duration

log = logging.getLogger(__name__)
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
_GOING_AWAY = (stops.EXIT_PREEMPTED, stops.EXIT_PREEMPTED_STAGED, stops.EXIT_ABORTED)
HUNG_GRACE_S = 60.0  # a hung trainer's SIGTERM handler may still save; past this it is killed


@dataclass
class Settings:
    root: str
    poll_s: float  # how often a waiting worker looks again
    time_limit: float | None  # this session's (train.time_limit), counted from the worker's start
    limit_from_boot: bool
    lease_s: float  # checkpoint.lease_seconds: how long an experiment's lease may stay unrenewed
    single_machine: bool = False  # checkpoint.single_machine: a FUSE root is allowed for the claims


def settings(sweep: Sweep) -> Settings:
    """The sweep's root and session limits, from the base config; every experiment's config is checked first
    (a typo in one key fails now, naming the experiment, not after hours of the others)."""
    cfg = load_config(sweep.base, list(sweep.overrides))
    for e in sweep.experiments:
        if set(e.overrides) & {"root", "name"}:
            raise SweepError(f"{sweep.source}: experiment {e.name} sets root or name; the sweep names its runs and "
                             "keeps them under the base config's root (set `root` in the base or on the command line)")
        try:
            load_config(sweep.base, [*sweep.overrides, *e.args()])
        except ConfigError as err:
            raise SweepError(f"{sweep.source}: experiment {e.label()} ({e.name}): {err}") from None
    ck, tc = cfg.checkpoint, cfg.train
    return Settings(cfg.root, max(1.0, min(30.0, ck.lease_seconds / 4)), parse_duration(tc.time_limit),
                    tc.time_limit_from == "boot", ck.lease_seconds, ck.single_machine)


def _die_with_parent() -> None:  # in the child, before exec: a SIGKILLed worker takes its trainer with it
    set_parent_death_signal(signal.SIGKILL)


def stalled(watch: LeaseWatch, run: str, before: str | None, ttl_s: float) -> bool:
    """Whether the child training ``run`` is hung: the lease it took (a token other than ``before``, the one
    there when it started) is neither released nor renewed for its ttl on our clock. The trainer renews only
    while it makes progress (:mod:`voxrelay.checkpoint.lease`), so this is the same rule."""
    lease = read_lease(run)
    if lease is None or lease.get("token") in (None, before):
        return False  # not taken yet (the child is still starting, or watching an old holder's lease)
    return watch.state(storage.join(run, LEASE_FILE), lease, ttl_s) == "expired"


class Child:
    """A `voxrelay train` child in a process group of its own: a Ctrl-C reaches it once, from us, so it
    saves (a second SIGINT would abort it); its output is passed through, the last lines kept. ``hung``
    (polled every ``poll_s``) tells a child that makes no progress: it gets SIGTERM, SIGKILL after
    ``HUNG_GRACE_S``."""

    def __init__(self, cmd: list[str], hung: Callable[[], bool] | None = None, poll_s: float = 10.0):
        self.cmd = cmd
        self.hung = hung
        self.poll_s = poll_s
        self.tail: deque[str] = deque(maxlen=40)
        self.signalled: int | None = None
        self.was_hung = False

    def _watchdog(self, proc: subprocess.Popen, done: threading.Event) -> None:
        while not done.wait(self.poll_s):
            if self.hung is not None and self.hung():
                self.was_hung = True
                log.error("the trainer (pid %d) made no progress for its lease's length: stopping it", proc.pid)
                proc.terminate()
                if not done.wait(HUNG_GRACE_S):
                    proc.kill()
                return

    def run(self) -> int:
        proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                start_new_session=True, preexec_fn=_die_with_parent)
        done = threading.Event()
        threading.Thread(target=self._watchdog, args=(proc, done), name="voxrelay-sweep-watchdog", daemon=True).start()

        def forward(signum, _frame):
            self.signalled = signum
            if proc.poll() is None:
                os.kill(proc.pid, signum)

        previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                self.tail.append(line.rstrip("\n"))
            return proc.wait()
        finally:
            done.set()
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class Worker:
    def __init__(self, sweep: Sweep, conf: Settings, retry_failed: bool, started: float):
        self.sweep = sweep
        self.conf = conf
        self.retry_failed = retry_failed
        self.started = started
        self.retried: set[str] = set()  # failed experiments this worker tried again (once each)
        self.watch = LeaseWatch()  # the experiments' leases as seen across our polls, on our own clock

    def seconds_left(self) -> float | None:
        """Of this session's ``train.time_limit`` (the session is the worker's: it counts from its start)."""
        if self.conf.time_limit is None or self.conf.limit_from_boot:
            return None  # none, or each child counts from the machine's boot itself
        return self.conf.time_limit - (time.time() - self.started)

    def next_one(self, now: list[st.ExperimentState]) -> st.ExperimentState | None:
        for s in now:
            if s.state in (st.PENDING, st.RESUMABLE):
                return s
            if s.state == st.FAILED and self.retry_failed and s.experiment.name not in self.retried:
                self.retried.add(s.experiment.name)
                return s
        return None

    def run(self) -> int:
        st.write_queue(self.conf.root, self.sweep)
        waiting_for: set[str] = set()
        while True:
            now = st.states(self.conf.root, self.sweep, self.watch, self.conf.lease_s)
            todo = self.next_one(now)
            if todo is None:
                busy = {s.experiment.name for s in now if s.state == st.RUNNING}
                if not busy:
                    return _summary(now)
                if busy != waiting_for:
                    log.info("waiting: %s trained by other workers (an experiment whose worker dies is resumed "
                             "here once its lease expires)", ", ".join(sorted(busy)))
                    waiting_for = busy
                time.sleep(self.conf.poll_s)  # polling the bucket: other machines give no other sign
                continue
            waiting_for = set()
            code = self.train(todo)
            if code is not None:
                return code

    def train(self, s: st.ExperimentState) -> int | None:
        """Train one experiment; the worker's exit code when it must stop (preempted, out of time), else None."""
        e, root = s.experiment, self.conf.root
        left = self.seconds_left()
        if left is not None and left < 1:
            log.info("this session's train.time_limit is reached; re-run the sweep in a new session to go on")
            return stops.EXIT_TIME_LIMIT
        limit = [] if left is None else [f"train.time_limit={int(left)}s"]
        log.info("experiment %s (%s): %s", e.name, e.label(), "resuming" if s.state == st.RESUMABLE else "starting")
        if s.state == st.FAILED:
            st.clear_failure(root, self.sweep, e)
        elif (unseen := st.unseen_ends(root, self.sweep, e)) >= st.MAX_UNSEEN_ENDS:
            why = (f"started {unseen} times in a row without an end any worker saw: its machine went down with it "
                   "(a kernel OOM kill, a driver crash?)")
            log.error("experiment %s failed (%s); the sweep goes on", e.name, why)
            st.record_failure(root, self.sweep, e, None, why, [])
            return None
        st.note_start(root, self.sweep, e)
        before = (read_lease(s.run_uri) or {}).get("token")
        child = Child([sys.executable, "-m", "voxrelay", "train", self.sweep.base, *self.sweep.overrides, *limit,
                       *e.args()], lambda: stalled(self.watch, s.run_uri, before, self.conf.lease_s), self.conf.poll_s)
        code = child.run()
        st.note_end(root, self.sweep, e)
        after = st.experiment_state(root, self.sweep, e, self.watch, self.conf.lease_s)
        if child.was_hung:
            why = f"hung: no step, eval or save, so its lease went unrenewed for {self.conf.lease_s:.0f} s; stopped"
            log.error("experiment %s %s; the sweep goes on", e.name, why)
            st.record_failure(root, self.sweep, e, code, why, list(child.tail))
            return None
        if after.ended:
            return None
        if child.signalled is not None or code in _GOING_AWAY:
            return code if code else 128 + (child.signalled or 0)
        if code == stops.EXIT_TIME_LIMIT and after.stop_reason == stops.TIME_LIMIT.reason:
            log.info("this session's train.time_limit is reached; re-run the sweep in a new session to go on")
            return code
        if code == 2 and after.state == st.RUNNING:
            log.info("experiment %s was claimed by another worker: %s", e.name, after.holder.get("host"))
            return None
        why = _why(code, child.tail)
        log.error("experiment %s failed (%s); the sweep goes on (sweep status shows it; --retry-failed tries it "
                  "again)", e.name, why)
        st.record_failure(root, self.sweep, e, code, why, list(child.tail))
        return None


def _why(code: int, tail) -> str:
    known = {stops.EXIT_NON_FINITE: "non-finite losses (train.max_bad_steps)",
             stops.EXIT_OUT_OF_MEMORY: "out of memory",
             stops.EXIT_FAILED_FOR_GOOD: "storage refused or saves kept failing", stops.EXIT_USER_ERROR: "refused"}
    errors = [line for line in tail if line.lstrip().startswith(("error:", "ERROR"))]
    what = known.get(code, "crashed")
    return f"exit {code}: {what}" + (f": {errors[-1].strip()}" if errors else "")


def _summary(now: list[st.ExperimentState]) -> int:
    failed = [s.experiment.name for s in now if s.state == st.FAILED]
    if failed:
        log.error("the sweep has ended; %d failed: %s (`voxrelay sweep status` shows why; re-run with "
                  "--retry-failed to try them again)", len(failed), ", ".join(failed))
        return 1
    log.info("the sweep has ended: %d experiments", len(now))
    return 0


def run_sweep(sweep: Sweep, retry_failed: bool = False) -> int:
    started = pre.session_start("process")  # train.time_limit counts from here for every experiment
    conf = settings(sweep)
    # the sweep's claims are leases too: refused where a run's lease would be (a FUSE root without single_machine)
    if (warning := check_root_for_leases(conf.root, root_mount(conf.root), conf.single_machine)) is not None:
        log.warning(warning)
    return Worker(sweep, conf, retry_failed, started).run()
