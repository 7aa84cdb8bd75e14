"""One writer per run: a lease object ``<run>/lease.json`` that `voxrelay train` takes before writing
anything to the run folder, renews while it trains and releases at exit.

Two writers of one run (a Colab reconnect beside the old runtime, two notebooks, a spot job restarted
before the old VM is gone) would delete each other's checkpoints through retention, mix the files
of one step and overwrite metrics and config in turn. So:

* taking the lease is an atomic conditional write (:mod:`voxrelay.storage.conditional`: GCS
  ``ifGenerationMatch``, S3 ``If-None-Match``/``If-Match``, ``O_EXCL`` + ``flock`` locally): of two
  sessions racing, exactly one wins;
* a lease is free once released, once expired (``expires``: ``checkpoint.lease_seconds`` after its
  last renewal; the holder renews every third of that), or when its holder ran on this machine (same
  boot, same pid namespace) and that process is gone: a SIGKILLed session is taken over at once
  by the next one here, and by any machine once its lease expires;
* a live lease is refused (:class:`LeaseHeld`, exit 2) with the holder (host, pid, since, expiry)
  and the fix; ``--take-over`` replaces it at once (fencing: the old holder's renewal and its check
  before every commit fail, so it stops without writing), then waits out the old lease so a write it
  had already begun has landed;
* the holder checks the lease (:meth:`RunLease.check`) right before each checkpoint commit, each
  retention pass and each copy of its metrics: after a take-over it writes nothing more
  (:class:`LeaseLost`). The check precedes a write by milliseconds; object stores have no
  conditional write across objects, so that is the remaining window.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable

from voxrelay import storage
from voxrelay.errors import UserError
from voxrelay.host import boot_id, pid_namespace, started_at
from voxrelay.paths import LEASE_FILE

log = logging.getLogger(__name__)


class LeaseHeld(UserError):
    """Another live session holds the run's lease; the message names it and the ways out."""


class LeaseLost(UserError):
    """This session's lease was taken over: it must not write to the run folder any more."""


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def describe(record: dict, now: float) -> str:
    """``host h, pid p, since T (expires in N s)`` of a lease record."""
    left = record.get("expires", 0) - now
    expiry = f"expires in {left:.0f} s" if left > 0 else f"expired {-left:.0f} s ago"
    return (f"host {record.get('host')}, pid {record.get('pid')}, since {_when(record.get('since', 0))} "
            f"(renewed {now - record.get('renewed', 0):.0f} s ago, {expiry})")


class RunLease:
    """The lease of one run, held by this process once :meth:`acquire` returns."""

    def __init__(self, run_uri: str, ttl_s: float, clock: Callable[[], float] = time.time):
        self.run_uri = run_uri
        self.uri = storage.join(run_uri, LEASE_FILE)
        self.ttl_s = ttl_s
        self.clock = clock
        self.record: dict | None = None  # what we last wrote
        self.version: str | None = None
        self.lost: str | None = None  # why we no longer hold it (taken over)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ taking it

    def _new_record(self, token: str, since: float, seq: int, **extra) -> dict:
        now = self.clock()
        return {"run": self.run_uri, "token": token, "host": socket.gethostname(), "pid": os.getpid(),
                "boot_id": boot_id(), "pid_ns": pid_namespace(), "started": started_at(os.getpid()),
                "command": " ".join(sys.argv)[:300], "since": since, "renewed": now, "expires": now + self.ttl_s,
                "ttl": self.ttl_s, "seq": seq, "released": False, **extra}

    def acquire(self, take_over: bool = False) -> str | None:
        """Take the lease; raises :class:`LeaseHeld` while another live session holds it (unless
        ``take_over``). Returns what was taken over (a line for the log), or None."""
        mine = self._new_record(uuid.uuid4().hex, self.clock(), 0)
        for _ in range(8):  # each round: someone else changed it meanwhile
            try:
                self._hold(mine, storage.create_new(self.uri, _encode(mine)))
                return None
            except FileExistsError:
                pass
            got = storage.read_versioned(self.uri)
            if got is None:
                continue  # released by deletion between our two calls
            current = _decode(got.data)
            if current.get("token") == mine["token"]:  # our create landed, its answer was lost and retried
                self._hold(mine, got.version)
                return None
            state = self._state(current)
            if state == "live" and not take_over:
                raise LeaseHeld(self._held_message(current))
            mine["taken_from"] = {k: current.get(k) for k in ("host", "pid", "since", "token")} | {"state": state}
            wait = max(0.0, current.get("expires", 0) - self.clock()) if state == "live" else 0.0
            mine["expires"] = self.clock() + wait + self.ttl_s  # ours outlives the wait for the fenced holder
            try:
                self._hold(mine, storage.replace_if(self.uri, _encode(mine), got.version))
            except storage.PreconditionFailed:
                continue
            if state == "live":  # fenced: its renewals and commit checks now fail; let a write in flight land
                log.warning("took over the lease of %s from %s; waiting %.0f s for its lease to run out",
                            self.run_uri, describe(current, self.clock()), wait)
                self._stop.wait(wait)
                self.renew()  # a whole lease from now on, before any renewal thread starts
            if state == "released":
                return None
            return f"took over {self.run_uri} from {describe(current, self.clock())}: {state}"
        raise LeaseHeld(f"could not take the lease {self.uri}: other sessions keep changing it. Make sure a "
                        "single `voxrelay train` of this run is starting, then re-run")

    def _hold(self, record: dict, version: str) -> None:
        self.record, self.version, self.lost = record, version, None

    def _state(self, record: dict) -> str:
        return lease_state(record, self.clock())

    def _held_message(self, record: dict) -> str:
        now = self.clock()
        left = max(0, record.get("expires", now) - now)
        return (
            f"{self.run_uri} is being trained by another session: {describe(record, now)}; its command: "
            f"{record.get('command', '?')!r}. Two writers of one run would delete each other's checkpoints. If that "
            f"session is running, let it finish or stop it (or train under another name, name=... ). If it is gone "
            f"(a closed Colab runtime, a lost VM), re-run once its lease expires (in {left:.0f} s), or now with "
            "--take-over: the old session is fenced (its later writes are refused) and this one resumes"
        )

    # ------------------------------------------------------------------ keeping it

    def start_renewing(self) -> None:
        """Renew every third of the lease in a background thread until :meth:`release`."""
        self._thread = threading.Thread(target=self._renew_loop, name="voxrelay-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.renew()
            except LeaseLost:
                return
            except Exception as err:  # the bucket is away: nothing can be committed either; try again
                log.warning("could not renew the lease of %s (%s: %s); retrying", self.run_uri, type(err).__name__,
                            err)

    def renew(self) -> None:
        with self._lock:
            if self.lost:
                raise LeaseLost(self.lost)
            kept = {k: self.record[k] for k in ("taken_from",) if k in self.record}
            mine = self._new_record(self.record["token"], self.record["since"], self.record["seq"] + 1, **kept)
            try:
                self._hold(mine, storage.replace_if(self.uri, _encode(mine), self.version))
            except storage.PreconditionFailed:
                self._recheck()

    def _recheck(self) -> None:
        """After a failed precondition: still ours (a retried write of ours landed) or lost."""
        got = storage.read_versioned(self.uri)
        current = _decode(got.data) if got is not None else {}
        if current.get("token") == self.record["token"] and not current.get("released"):
            self.record, self.version = current, got.version
            return
        self.lost = (f"another session took over {self.run_uri}: " + describe(current, self.clock())
                     if current else f"the lease {self.uri} was deleted")
        log.error("%s; this session stops without writing to the run folder", self.lost)
        raise LeaseLost(self.lost)

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless this session still holds the lease (read now, in storage);
        an expired lease of ours (the bucket was away) is renewed first."""
        with self._lock:
            if self.lost:
                raise LeaseLost(self.lost)
            got = storage.read_versioned(self.uri)
            if got is None or got.version != self.version:
                self._recheck()
        if self.clock() >= self.record["expires"] - self.ttl_s / 3:
            self.renew()

    def release(self) -> None:
        """Mark the lease free (kept as a record of the last writer); a lost or never-taken one is left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            if self.record is None or self.lost:
                return
            done = self.record | {"released": True, "renewed": self.clock(), "expires": self.clock(),
                                  "seq": self.record["seq"] + 1}
            try:
                self.version = storage.replace_if(self.uri, _encode(done), self.version)
                self.record = done
            except Exception as err:  # it expires by itself
                log.warning("could not release the lease of %s (%s); it expires in %.0f s", self.run_uri, err,
                            self.record["expires"] - self.clock())


def lease_state(record: dict, now: float) -> str:
    """released, expired, dead (its process is gone from this machine) or live: whether a lease record (read
    from a run folder) still holds the run at ``now``."""
    if record.get("released"):
        return "released"
    if not isinstance(record.get("expires"), int | float) or now >= record["expires"]:
        return "expired"
    if record.get("boot_id") and record.get("boot_id") == boot_id() and record.get("pid_ns") == pid_namespace() \
            and record.get("host") == socket.gethostname():
        pid, started = record.get("pid"), record.get("started")
        if isinstance(pid, int) and isinstance(started, int | float):  # else it cannot be told: live
            now_started = started_at(pid)
            if now_started is None or abs(now_started - started) > 1.0:  # gone, or the pid was reused
                return "dead"
    return "live"


def read_lease(run_uri: str) -> dict | None:
    """The run's lease record (for `status`), or None."""
    got = storage.read_versioned(storage.join(run_uri, LEASE_FILE))
    return _decode(got.data) if got is not None else None


def _encode(record: dict) -> bytes:
    return json.dumps(record, indent=1, sort_keys=True).encode()


def _decode(data: bytes) -> dict:
    """A lease record; bytes that are not one (a truncated or foreign file) read as an expired lease."""
    try:
        record = json.loads(data)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}
