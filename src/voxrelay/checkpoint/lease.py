"""One writer per run: a lease object ``<run>/lease.json`` that `voxrelay train` takes before writing
anything to the run folder, renews while it trains and releases at exit.

Two writers of one run (a Colab reconnect beside the old runtime, two notebooks, a spot job restarted
before the old VM is gone) would delete each other's checkpoints through retention, mix the files
of one step and overwrite metrics and config in turn. So:

* taking the lease is an atomic conditional write (:mod:`voxrelay.storage.conditional`: GCS
  ``ifGenerationMatch``, S3 ``If-None-Match``/``If-Match``, ``O_EXCL`` + ``flock`` locally): of two
  sessions racing, exactly one wins;
* a lease is free once released, once expired, or when its holder ran on this machine (same boot, same
  pid namespace) and that process is gone (its pid and start time in clock ticks, which a wall-clock
  step does not move): a SIGKILLed session is taken over at once by the next one here, and by any
  machine once its lease expires;
* expiry is judged on the contender's own clock, never by comparing two machines' wall clocks: the
  holder advances a renewal counter (``seq``) every third of its ``ttl`` (``checkpoint.lease_seconds``),
  and a contender (:class:`LeaseWatch`) takes the lease only after seeing that counter unchanged for
  the holder's ``ttl`` on its own monotonic clock. A starting session therefore watches a lease it
  cannot judge for up to ``ttl``: renewed meanwhile, it is refused; silent, it takes over. The
  ``expires`` field is written for people (``voxrelay status``), not for decisions;
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
from voxrelay.checkpoint.host import boot_id, pid_namespace, start_ticks, started_at
from voxrelay.errors import UserError
from voxrelay.paths import LEASE_FILE
from voxrelay.storage.mounts import Mount, gcsfuse_uri, mount_kind

log = logging.getLogger(__name__)
# progress, not pulse: the renewal thread renews only while training reported progress (a step, an eval, a save:
# RunLease.progress) within this bound; a hung trainer (a stuck collective, a dead data mount) lets its lease
# expire so another session can resume the run. 30 min: longer than a first step's compile, an eval or a big save
PROGRESS_S = 1800.0
DEFAULT_TTL_S = 60.0  # checkpoint.lease_seconds' default: for a record naming no ttl (written before it did)


class LeaseHeld(UserError):
    """Another live session holds the run's lease; the message names it and the ways out."""


class LeaseLost(UserError):
    """This session's lease was taken over: it must not write to the run folder any more."""


class LeaseUnsafe(UserError):
    """The root's storage does not refuse a second conditional create: a lease there would not exclude anyone."""


# a local root on a FUSE mount (Colab's Google Drive, gcsfuse): O_EXCL and flock there are answered by this machine's
# FUSE daemon, so they exclude a second session here but not another machine (a Colab runtime reconnected beside
# the old one), and no scheme over such a mount can: Drive and gcsfuse publish a file when they upload it, after a
# delay nothing bounds, so a claim-and-wait scheme would only be as safe as a guess. Hence refused for leases unless
# the user states that one machine at a time trains the run (checkpoint.single_machine: seed 002's Colab on Drive)
FUSE_LEASE_CAVEAT = ("one writer per run holds only on this machine: the lease's O_EXCL create and flock on a FUSE "
                     "mount are answered by this machine's FUSE daemon and do not exclude another machine (a Colab "
                     "runtime reconnected beside the old one could write the run too)")


def check_root_for_leases(root: str, mount: Mount | None, single_machine: bool = False,
                          probe: Callable[[str], str | None] = storage.ignores_conditional_create) -> str | None:
    """Refuse (:class:`LeaseUnsafe`, exit 2) a root where a run's lease would not exclude another session: a
    local root on a FUSE ``mount`` (:func:`voxrelay.storage.mounts.root_mount`), unless ``single_machine``
    (then a warning is returned), and a store that does not refuse a second conditional create (``probe``: the
    storage seam's, :func:`voxrelay.storage.ignores_conditional_create`; a test passes one over such a store)."""
    warning = None
    if mount is not None:
        kind = mount_kind(mount)
        if not single_machine:
            raise LeaseUnsafe(f"{root} is on a {kind} mount ({mount.point}): {FUSE_LEASE_CAVEAT}. "
                              f"{fuse_root_fix(root, mount)}")
        warning = f"{root} is on a {kind} mount: {FUSE_LEASE_CAVEAT} (checkpoint.single_machine: true)"
    ignored = probe(root)
    if ignored is not None:
        raise LeaseUnsafe(
            f"{root} cannot hold a run's lease: {ignored}. Two sessions of one run would both win it and delete "
            "each other's checkpoints. Use a store with conditional writes (GCS; AWS S3; MinIO, R2 and others "
            "that honour If-None-Match/If-Match on PutObject), or a local folder")
    return warning


def fuse_root_fix(root: str, mount: Mount) -> str:
    """The ways out for a run's root on a FUSE ``mount`` (``train`` refuses it, ``doctor`` says so)."""
    bucket = gcsfuse_uri(root, mount)
    across = f"set root={bucket} (the bucket itself)" if bucket else "set root=gs://... or s3://..."
    return (f"For a lease across machines {across}; if only one machine at a time trains this run (one Colab "
            "runtime), set checkpoint.single_machine=true")


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def describe(record: dict) -> str:
    """``host h, pid p, since T (its clock), renewal #N at T2`` of a lease record: what it says, judged by nobody
    here (whether it still renews is told by watching ``seq``, :class:`LeaseWatch`, never by our clock against its)."""
    return (f"host {record.get('host')}, pid {record.get('pid')}, since {_when(record.get('since', 0))} by its clock "
            f"(renewal #{record.get('seq', 0)} at {_when(record.get('renewed', 0))}, every "
            f"{_ttl(record, DEFAULT_TTL_S) / 3:.0f} s while it trains)")


def glance(record: dict) -> str:
    """A one-off look at a lease (``voxrelay status``): released, dead (its process is gone from this machine),
    expired (not a lease record), or held: whether a holder elsewhere still renews cannot be told without watching
    its renewal counter for its ttl, so it reads as held."""
    state = lease_state(record, 0.0, DEFAULT_TTL_S)  # watched for 0 s: no ttl has passed
    return "held" if state == "live" else state


class LeaseWatch:
    """What this process saw of leases, and since when on its own monotonic ``clock``: a lease whose renewal
    counter stayed the same for its holder's ttl, as measured here, is expired. Keep one watch per contender
    (a sweep worker keeps one across its polls)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.seen: dict[str, tuple[tuple, float]] = {}  # lease uri -> (its renewal mark, when first seen so)

    def silent_for(self, uri: str, record: dict) -> float:
        """Seconds (on our clock) since the lease at ``uri`` last changed, as far as we watched; 0 at first sight."""
        mark, now = (record.get("token"), record.get("seq"), record.get("released")), self.clock()
        last = self.seen.get(uri)
        if last is None or last[0] != mark:
            self.seen[uri] = (mark, now)
            return 0.0
        return now - last[1]

    def state(self, uri: str, record: dict, ttl_s: float) -> str:
        """:func:`lease_state` of ``record`` as watched here (``ttl_s``: ours, for a record naming none)."""
        return lease_state(record, self.silent_for(uri, record), ttl_s)


class RunLease:
    """The lease of one run, held by this process once :meth:`acquire` returns. ``clock``: wall time, written in
    the record for people; ``watch``: our monotonic view of other holders; ``pause(s)``: waits (tests inject
    both to force interleavings without sleeping)."""

    def __init__(self, run_uri: str, ttl_s: float, clock: Callable[[], float] = time.time,
                 watch: LeaseWatch | None = None, pause: Callable[[float], object] | None = None):
        self.run_uri = run_uri
        self.uri = storage.join(run_uri, LEASE_FILE)
        self.ttl_s = ttl_s
        self.clock = clock
        self.watch = watch if watch is not None else LeaseWatch()
        self.pause = pause
        self.record: dict | None = None  # what we last wrote
        self.version: str | None = None
        self.held_at = 0.0  # when (watch.clock) we last wrote it
        self.lost: str | None = None  # why we no longer hold it (taken over)
        self.released = False
        self.progress_s = PROGRESS_S
        self.progress_at = 0.0  # when (watch.clock) training last reported progress
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ taking it

    def _new_record(self, token: str, since: float, seq: int, **extra) -> dict:
        now = self.clock()
        return {"run": self.run_uri, "token": token, "host": socket.gethostname(), "pid": os.getpid(),
                "boot_id": boot_id(), "pid_ns": pid_namespace(), "started": started_at(os.getpid()),
                "start_ticks": start_ticks(os.getpid()),
                "command": " ".join(sys.argv)[:300], "since": since, "renewed": now, "expires": now + self.ttl_s,
                "ttl": self.ttl_s, "seq": seq, "released": False, **extra}

    def acquire(self, take_over: bool = False) -> str | None:
        """Take the lease; raises :class:`LeaseHeld` while another live session holds it (unless
        ``take_over``). A lease this process cannot judge yet is watched for up to its ttl (see the module
        doc). Returns what was taken over (a line for the log), or None."""
        mine = self._new_record(uuid.uuid4().hex, self.clock(), 0)
        for _ in range(8):  # each round: someone else changed it meanwhile
            try:
                self._hold(mine, storage.create_new(self.uri, _encode(mine)))
                return None
            except FileExistsError:
                pass
            got = storage.read_versioned(self.uri)
            if got is not None and _decode(got.data).get("token") == mine["token"]:
                self._hold(mine, got.version)  # our create landed, its answer was lost and retried
                return None
            state, got = self._judge(got, take_over)
            if got is None:
                continue  # released by deletion meanwhile
            current = _decode(got.data)
            if state == "live" and not take_over:
                raise LeaseHeld(self._held_message(current))
            mine["taken_from"] = {k: current.get(k) for k in ("host", "pid", "since", "token")} | {"state": state}
            try:
                self._hold(mine, storage.replace_if(self.uri, _encode(mine), got.version))
            except storage.PreconditionFailed:
                continue
            if state == "live":  # fenced: its renewals and commit checks now fail; let a write in flight land
                wait = _ttl(current, self.ttl_s)
                log.warning("took over the lease of %s from %s; waiting %.0f s (its lease) for a write it began to "
                            "land", self.run_uri, describe(current), wait)
                self._pause(wait)
                self.renew()  # a whole lease from now on, before any renewal thread starts
            if state == "released":
                return None
            return f"took over {self.run_uri} from {describe(current)}: {state}"
        raise LeaseHeld(f"could not take the lease {self.uri}: other sessions keep changing it. Make sure a "
                        "single `voxrelay train` of this run is starting, then re-run")

    def _judge(self, got, take_over: bool):
        """(state, the version judged) of another session's lease: a lease that is neither released nor held by a
        gone process of this machine is watched until it is renewed (live) or stays silent for its ttl on our
        own clock (expired). ``take_over`` judges at once (it replaces a live lease anyway)."""
        seen = None
        while got is not None:
            current = _decode(got.data)
            state = self.watch.state(self.uri, current, self.ttl_s)
            mark = (current.get("token"), current.get("seq"))
            if state != "live" or take_over or (seen is not None and mark != seen):
                return state, got
            if seen is None:
                log.warning("%s has a lease (%s) that this session cannot judge yet: watching it for up to %.0f s "
                            "(renewed meanwhile: refused; silent: taken over)", self.run_uri,
                            describe(current), _ttl(current, self.ttl_s))
            seen = mark
            self._pause(min(10.0, max(0.05, _ttl(current, self.ttl_s) / 6)))
            got = storage.read_versioned(self.uri)
        return "released", None

    def _pause(self, seconds: float) -> None:
        if self.pause is not None:
            self.pause(seconds)
        else:
            self._stop.wait(seconds)

    def _hold(self, record: dict, version: str) -> None:
        self.record, self.version, self.lost, self.held_at = record, version, None, self.watch.clock()

    def _held_message(self, record: dict) -> str:
        ttl = _ttl(record, self.ttl_s)
        return (
            f"{self.run_uri} is being trained by another session (its lease was renewed while this one watched): "
            f"{describe(record)}; its command: "
            f"{record.get('command', '?')!r}. Two writers of one run would delete each other's checkpoints. If that "
            f"session is running, let it finish or stop it (or train under another name, name=... ). If it is gone "
            f"(a closed Colab runtime, a lost VM), re-run: a lease not renewed for {ttl:.0f} s is taken over; or "
            "now with --take-over: the old session is fenced (its later writes are refused) and this one resumes"
        )

    # ------------------------------------------------------------------ keeping it

    def start_renewing(self) -> None:
        """Renew every third of the lease in a background thread until :meth:`release`, while training makes
        progress (:meth:`progress`, counted from now)."""
        self.progress()
        self._thread = threading.Thread(target=self._renew_loop, name="voxrelay-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.renew_if_progressing()
            except LeaseLost:
                return
            except Exception as err:  # the bucket is away: nothing can be committed either; try again
                log.warning("could not renew the lease of %s (%s: %s); retrying", self.run_uri, type(err).__name__,
                            err)

    def progress(self) -> None:
        """Training made progress (a step, an eval, a save): the lease may be renewed for another bound."""
        self.progress_at = self.watch.clock()

    def renew_if_progressing(self) -> bool:
        """Renew unless training reported no progress for ``progress_s``: then the lease is left to expire."""
        silent = self.watch.clock() - self.progress_at
        if silent > self.progress_s:
            log.error("training made no progress for %.0f s (no step, eval or save): the lease of %s is not renewed "
                      "so that another session can take the run over", silent, self.run_uri)
            return False
        self.renew()
        return True

    def renew(self) -> None:
        with self._lock:
            self._still_holding()
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
        self.lost = (f"another session took over {self.run_uri}: " + describe(current)
                     if current else f"the lease {self.uri} was deleted")
        log.error("%s; this session stops without writing to the run folder", self.lost)
        raise LeaseLost(self.lost)

    def _still_holding(self) -> None:
        if self.lost:
            raise LeaseLost(self.lost)
        if self.released or self.record is None:
            raise LeaseLost(f"this session {'released' if self.released else 'never took'} the lease of "
                            f"{self.run_uri}: it must not write to the run folder")

    def check(self) -> None:
        """The fencing check before a write: raise :class:`LeaseLost` unless this session still holds the lease
        (read now, in storage; never after :meth:`release`); a lease of ours due for renewal is renewed."""
        with self._lock:
            self._still_holding()
            got = storage.read_versioned(self.uri)
            if got is None or got.version != self.version:
                self._recheck()
        if self.watch.clock() - self.held_at >= self.ttl_s / 3:
            self.renew()

    def release(self) -> None:
        """Mark the lease free (kept as a record of the last writer); a lost or never-taken one is left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            if self.record is None or self.lost or self.released:
                return
            self.released = True  # from now on check() and renew() refuse: never taken again by this object
            done = self.record | {"released": True, "renewed": self.clock(), "expires": self.clock(),
                                  "seq": self.record["seq"] + 1}
            try:
                self.version = storage.replace_if(self.uri, _encode(done), self.version)
                self.record = done
            except Exception as err:  # it expires by itself
                log.warning("could not release the lease of %s (%s); it expires in %.0f s", self.run_uri, err,
                            self.record["expires"] - self.clock())


def lease_state(record: dict, silent_s: float, ttl_s: float) -> str:
    """released, dead (its process is gone from this machine), expired (its renewal counter unchanged for its
    ttl: ``silent_s``, measured by the reader's own clock, see :class:`LeaseWatch`) or live. ``ttl_s``: for a
    record naming none. No wall clock of another machine is compared with ours."""
    if record.get("released"):
        return "released"
    if not record.get("token"):
        return "expired"  # not a lease record (a truncated or foreign file)
    if record.get("boot_id") and record.get("boot_id") == boot_id() and record.get("pid_ns") == pid_namespace() \
            and record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
        ticks = record.get("start_ticks")
        if isinstance(ticks, int) and start_ticks(record["pid"]) != ticks:  # gone, or the pid was reused
            return "dead"
    if silent_s >= _ttl(record, ttl_s):
        return "expired"
    return "live"


def _ttl(record: dict, default: float) -> float:
    """How long its holder may go between renewals (it renews every third of it)."""
    ttl = record.get("ttl")
    return float(ttl) if isinstance(ttl, int | float) and not isinstance(ttl, bool) and ttl > 0 else default


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
