"""Where each experiment of a sweep stands, read from the bucket alone (no torch): every machine working on
the sweep, and ``voxrelay sweep status``, see the same thing.

The queue is the bucket: ``<root>/sweeps/<sweep>/queue.json`` (the experiments and their overrides),
the runs' own folders (checkpoints: how far; ``lease.json``: who trains it now) and
``<root>/sweeps/<sweep>/failed/<experiment>.json`` (an experiment that ended in an error) and
``<root>/sweeps/<sweep>/attempts/<experiment>.json`` (how many times in a row a worker started it and never
saw its end: the machine went down with it; at :data:`MAX_UNSEEN_ENDS` it is recorded as failed).
An experiment is claimed by taking its run's lease (:mod:`voxrelay.checkpoint.lease`: an atomic
conditional create, renewed by the live trainer, left to expire by a dead one), so never two machines
train one run. Whether a lease is live is judged as the lease module does (its renewal counter watched on
this machine's monotonic clock, :class:`~voxrelay.checkpoint.lease.LeaseWatch`); without a watch (a one-off
``sweep status``) a lease neither released nor left by a gone process of this machine reads as running.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass

import yaml

from voxrelay import storage
from voxrelay.checkpoint import stops
from voxrelay.checkpoint.lease import LeaseWatch, lease_state, read_lease
from voxrelay.checkpoint.store import CommittedStore
from voxrelay.paths import CKPT_DIR, CONFIG_SNAPSHOT, LEASE_FILE
from voxrelay.sweep.spec import SWEEPS_DIR, Experiment, Sweep

QUEUE_FILE = "queue.json"
FAILED_DIR = "failed"
ATTEMPTS_DIR = "attempts"
# starts in a row whose end no worker saw (the machine died with its trainer: a kernel OOM, a driver crash, a
# preemption without notice) before the experiment counts as failed: one is bad luck, three is the experiment
MAX_UNSEEN_ENDS = 3
PENDING, RUNNING, RESUMABLE = "pending", "running", "resumable"  # not ended: a worker will (go on to) train it
FINISHED, EARLY_STOPPED, STOPPED, FAILED = "finished", stops.SWEEP_EARLY_STOPPED, stops.SWEEP_STOPPED, "failed"  # ended
ENDED = (FINISHED, EARLY_STOPPED, STOPPED)
# a run stopped by one of these (the manifest's `stopped`) cannot go on without a config change: it has ended
_FINAL_STOPS = {s.reason: s.sweep_state for s in stops.STOPS.values() if s.sweep_state}


def sweep_uri(root: str, sweep: Sweep) -> str:
    return storage.join(root, SWEEPS_DIR, sweep.name)


def run_uri(root: str, experiment: Experiment) -> str:
    return storage.checked_join(storage.join(root, "runs"), experiment.name, "the sweep's queue", single=True)


@dataclass
class ExperimentState:
    experiment: Experiment
    run_uri: str
    state: str
    durable_step: int | None = None
    max_steps: int | None = None
    stop_reason: str | None = None  # the newest checkpoint's session stopped early: why
    holder: dict | None = None  # the live lease's record (state running)
    failure: dict | None = None  # the failure record (state failed)

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def _snapshot(run: str) -> dict | None:
    """The run's config snapshot (written when training starts), or None before that."""
    snapshot = storage.join(run, CONFIG_SNAPSHOT)
    return (yaml.safe_load(storage.read_text(snapshot)) or {}) if storage.exists(snapshot) else None


def experiment_state(root: str, sweep: Sweep, experiment: Experiment, watch: LeaseWatch | None = None,
                     ttl_s: float = 60.0) -> ExperimentState:
    """``watch``: a worker's view of the leases across its polls; ``ttl_s``: for a lease record naming none."""
    run = run_uri(root, experiment)
    committed = CommittedStore(storage.join(run, CKPT_DIR)).list()
    lease = read_lease(run)
    failure = read_failure(root, sweep, experiment)
    snapshot = _snapshot(run)
    max_steps = ((snapshot or {}).get("train") or {}).get("max_steps")
    s = ExperimentState(experiment, run, PENDING, committed[0].step if committed else None, max_steps,
                        committed[0].manifest.get("stopped") if committed else None)
    if s.max_steps is not None and s.durable_step is not None and s.durable_step >= s.max_steps:
        s.state = FINISHED
    elif s.stop_reason in _FINAL_STOPS:
        s.state = _FINAL_STOPS[s.stop_reason]
    elif lease is not None and _lease_state(run, lease, watch, ttl_s) == "live":
        s.state, s.holder = RUNNING, lease
    elif failure is not None:
        s.state, s.failure = FAILED, failure
    elif lease is not None or committed or snapshot is not None:
        s.state = RESUMABLE  # started before, not running now: the next worker resumes it
    return s


def _lease_state(run: str, lease: dict, watch: LeaseWatch | None, ttl_s: float) -> str:
    if watch is None:
        return lease_state(lease, 0.0, ttl_s)
    return watch.state(storage.join(run, LEASE_FILE), lease, ttl_s)


def states(root: str, sweep: Sweep, watch: LeaseWatch | None = None, ttl_s: float = 60.0) -> list[ExperimentState]:
    return [experiment_state(root, sweep, e, watch, ttl_s) for e in sweep.experiments]


def _failure_uri(root: str, sweep: Sweep, experiment: Experiment) -> str:
    return storage.checked_join(storage.join(sweep_uri(root, sweep), FAILED_DIR), f"{experiment.name}.json",
                                "the sweep's queue", single=True)


def read_failure(root: str, sweep: Sweep, experiment: Experiment) -> dict | None:
    uri = _failure_uri(root, sweep, experiment)
    if not storage.exists(uri):
        return None
    try:
        return json.loads(storage.read_text(uri))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"error": f"{uri} is not a failure record"}


def record_failure(root: str, sweep: Sweep, experiment: Experiment, exit_code: int | None, why: str,
                   tail: list[str]) -> None:
    storage.write_json(_failure_uri(root, sweep, experiment), {
        "experiment": experiment.name, "exit_code": exit_code, "error": why, "output_tail": tail[-20:],
        "host": socket.gethostname(), "time": time.time()})


def clear_failure(root: str, sweep: Sweep, experiment: Experiment) -> None:
    for uri in (_failure_uri(root, sweep, experiment), _attempts_uri(root, sweep, experiment)):
        if storage.exists(uri):
            storage.delete(uri)


def _attempts_uri(root: str, sweep: Sweep, experiment: Experiment) -> str:
    return storage.checked_join(storage.join(sweep_uri(root, sweep), ATTEMPTS_DIR), f"{experiment.name}.json",
                                "the sweep's queue", single=True)


def unseen_ends(root: str, sweep: Sweep, experiment: Experiment) -> int:
    """Starts of the experiment in a row whose end no worker saw (0 when none, or the record is damaged)."""
    uri = _attempts_uri(root, sweep, experiment)
    if not storage.exists(uri):
        return 0
    try:
        return int(json.loads(storage.read_text(uri)).get("unseen_ends", 0))
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError):
        return 0


def note_start(root: str, sweep: Sweep, experiment: Experiment) -> int:
    """Count a start before the child runs (a machine that dies with it leaves the count up); the new count."""
    count = unseen_ends(root, sweep, experiment) + 1
    storage.write_json(_attempts_uri(root, sweep, experiment), {
        "experiment": experiment.name, "unseen_ends": count, "host": socket.gethostname(), "time": time.time()})
    return count


def note_end(root: str, sweep: Sweep, experiment: Experiment) -> None:
    """A worker saw the child end (whatever its code): the machine survived, the count starts again."""
    uri = _attempts_uri(root, sweep, experiment)
    if storage.exists(uri):
        storage.delete(uri)


def write_queue(root: str, sweep: Sweep) -> str:
    """``queue.json``: the sweep's experiments as this sweep file lists them now (rewritten when it changed)."""
    uri = storage.join(sweep_uri(root, sweep), QUEUE_FILE)
    queue = {"sweep": sweep.name, "source": sweep.source, "base": sweep.base, "base_digest": sweep.base_digest,
             "overrides": list(sweep.overrides),
             "experiments": [{"name": e.name, "overrides": e.overrides} for e in sweep.experiments]}
    if not storage.exists(uri) or json.loads(storage.read_text(uri)) != queue:
        storage.write_json(uri, queue)
    return uri
