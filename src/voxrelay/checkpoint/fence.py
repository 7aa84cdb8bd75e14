"""Fenced writes: every object a process writes to a run's checkpoints goes through a :class:`FencedWriter`,
which asks the run's lease "still ours?" right before it (one place for the check, not one per call site).

Only rank 0 holds the lease (:class:`voxrelay.checkpoint.lease.RunLease`); its check is :meth:`RunLease.check`.
The other processes of a job (the other machines of a multi-machine job upload their own checkpoint parts) get
rank 0's lease token at start and check with a :class:`LeaseFence`: the run's lease record must still carry that
token and not be released. After a ``--take-over`` the new session's token is there, so an old job's machines
stop writing at their next object, as its rank 0 does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from voxrelay import storage
from voxrelay.checkpoint.lease import LeaseLost, describe, read_lease

Guard = Callable[[], None]


class LeaseFence:
    """The guard of a process that writes to a run under the lease another process of its job holds."""

    def __init__(self, run_uri: str, token: str, clock: Callable[[], float] = time.time):
        self.run_uri = run_uri
        self.token = token
        self.clock = clock

    def __call__(self) -> None:
        record = read_lease(self.run_uri)
        if record and record.get("token") == self.token and not record.get("released"):
            return
        why = (f"another session took over {self.run_uri}: {describe(record)}" if record and
               record.get("token") != self.token else f"the lease of {self.run_uri} was released or deleted")
        raise LeaseLost(f"{why}; this process of the job writes nothing more to the run folder")


class FencedWriter:
    """Storage writes that each check ``guard`` (None: unfenced, e.g. a test's store) before the object."""

    def __init__(self, guard: Guard | None):
        self.guard = guard

    def check(self) -> None:
        if self.guard is not None:
            self.guard()

    def put_file(self, local: Path, uri: str) -> None:
        self.check()
        storage.put_file(local, uri)

    def write_json(self, uri: str, obj) -> None:
        self.check()
        storage.write_json(uri, obj)

    def delete(self, uri: str, recursive: bool = False) -> None:
        self.check()
        storage.delete(uri, recursive=recursive)


def job_guard(ranks, lease, run_uri: str) -> Guard | None:
    """This process's guard for writes to ``run_uri`` (a collective: every process of the job calls it): rank 0's
    lease check, or a :class:`LeaseFence` on rank 0's token elsewhere; None when no lease is held (no run lease)."""
    token = ranks.broadcast(lease.record["token"] if lease is not None and lease.record else None)
    if lease is not None:
        return lease.check
    return LeaseFence(run_uri, token) if token else None
