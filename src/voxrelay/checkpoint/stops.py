"""Why a training session stops and what that means, in one table: each :class:`Stop`'s reason (the text a
checkpoint manifest's ``stopped``, ``usage.json`` and ``voxrelay status`` show), its exit code, how serious it is
when the processes of a job disagree, whether the same command continues the run, and what a sweep makes of an
experiment that stopped so. The loop (:mod:`voxrelay.train.stops`, :mod:`voxrelay.train.loop`), the CLI and the
sweep read it; docs/reference/exit-codes.md lists its codes (a test keeps the two equal).

A signal or a spot/preemption notice stops under its own name (``SIGTERM``, ``gcp preemption notice``): every
reason not in :data:`STOPS` is one of those (:func:`stop_of`).
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK = 0
EXIT_USER_ERROR = 2  # bad input (the CLI's UserError); for training also: this session may no longer write the run
# a permanent failure a new machine would meet too (storage refusing uploads: HTTP 403, no such bucket; or
# checkpoint.max_failed_saves saves in a row not staged): never "run it again" (sysexits' EX_IOERR, beside 75)
EXIT_FAILED_FOR_GOOD = 74
EXIT_PREEMPTED = 75  # stopped by a signal or a preemption notice; the checkpoint is durable
EXIT_PREEMPTED_STAGED = 76  # stopped; the checkpoint is on local disk only (upload did not finish)
EXIT_TIME_LIMIT = 77  # train.time_limit (this session), train.total_time_limit or cost.budget reached; durable
EXIT_NON_FINITE = 78  # train.max_bad_steps non-finite steps in a row; checkpoint (last good weights) durable
EXIT_OUT_OF_MEMORY = 79  # a step ran out of GPU memory; the last good state is saved (one process) or committed
EXIT_ABORTED = 130  # second SIGINT (or Ctrl-C outside training): aborted without saving

# a sweep's state for an experiment whose newest checkpoint stopped for good (voxrelay.sweep.state)
SWEEP_STOPPED, SWEEP_EARLY_STOPPED = "stopped", "early-stopped"


@dataclass(frozen=True)
class Stop:
    """One way a session ends early. ``exit_code`` is the session's when its checkpoint is durable (see
    :func:`exit_code` for the others); ``severity``: lower wins when processes disagree (a lost lease first, then a
    signal or notice); ``again``: running the same command continues the run; ``sweep_state``: a sweep's verdict on
    an experiment that stopped so (None: a worker resumes it)."""

    reason: str
    exit_code: int
    severity: int
    again: bool
    meaning: str
    sweep_state: str | None = None


LEASE_LOST = Stop("the run was taken over by another session", EXIT_USER_ERROR, 0, False,
                  "another session took the run over; this one stops without saving")
STORAGE = Stop("storage error", EXIT_FAILED_FOR_GOOD, 2, False, "the bucket refused the checkpoint (credentials, "
               "permissions, no such bucket): fix that first")
SAVES_FAILED = Stop("checkpoint.max_failed_saves", EXIT_FAILED_FOR_GOOD, 3, False,
                    "that many saves in a row could not be staged (a full disk)")
TIME_LIMIT = Stop("train.time_limit", EXIT_TIME_LIMIT, 4, True, "this session's time is up; the next one continues")
TOTAL_TIME_LIMIT = Stop("train.total_time_limit", EXIT_TIME_LIMIT, 5, False, "the run's training time is spent",
                        SWEEP_STOPPED)
BUDGET = Stop("cost.budget", EXIT_TIME_LIMIT, 6, False, "the run's money is spent (raise cost.budget to go on)",
              SWEEP_STOPPED)
NON_FINITE = Stop("non-finite steps", EXIT_NON_FINITE, 7, False,
                  "train.max_bad_steps non-finite steps in a row; the checkpoint holds the last good weights")
EARLY_STOP = Stop("early stopping", EXIT_OK, 8, False,
                  "the eval loss stopped improving (train.early_stopping_patience)", SWEEP_EARLY_STOPPED)
OUT_OF_MEMORY = Stop("out of memory", EXIT_OUT_OF_MEMORY, 9, False, "a step ran out of GPU memory; see the advice "
                     "printed with it")
STOPS: dict[str, Stop] = {s.reason: s for s in (LEASE_LOST, STORAGE, SAVES_FAILED, TIME_LIMIT, TOTAL_TIME_LIMIT,
                                                 BUDGET, NON_FINITE, EARLY_STOP, OUT_OF_MEMORY)}


def preemption(name: str) -> Stop:
    """The stop of a signal or a preemption notice called ``name``: the machine is going away."""
    return Stop(name, EXIT_PREEMPTED, 1, True, "a signal or a preemption notice; the next machine continues")


def stop_of(reason: str | None) -> Stop | None:
    """The :class:`Stop` of a recorded ``reason`` (None: the run reached train.max_steps)."""
    if reason is None:
        return None
    return STOPS.get(reason) or preemption(reason)


def is_preemption(reason: str | None) -> bool:
    return reason is not None and reason not in STOPS


def exit_code(reason: str | None, durable: bool, refused: bool = False) -> int:
    """A session's exit code: 75/76 only where a new machine can do better (a signal, an upload that did not finish
    in time); a cause that follows the run to any machine (storage refusing the upload: ``refused``, saves that
    keep failing) is final: 74; else the stop's own code (0 for max_steps and early stopping)."""
    stop = stop_of(reason)
    if stop is LEASE_LOST:
        return EXIT_USER_ERROR
    if refused or (stop is not None and stop.exit_code == EXIT_FAILED_FOR_GOOD):
        return EXIT_FAILED_FOR_GOOD
    if not durable:
        return EXIT_PREEMPTED_STAGED
    return EXIT_OK if stop is None else stop.exit_code

