"""Preemption and deadlines: when to stop, save and exit.

* SIGTERM / SIGINT / SIGUSR1 (Colab shutting down, a spot VM's notice, `kill`, Ctrl-C): the loop
  finishes its current step, saves synchronously, waits for the upload up to a grace period and
  exits with ``EXIT_PREEMPTED`` (durable) or ``EXIT_PREEMPTED_STAGED`` (saved only on local
  disk); the exit codes are in :mod:`voxrelay.checkpoint.stops`. A second SIGINT aborts at once (exit
  130); a checkpoint is committed by its manifest alone, so an abort never leaves a committed-but-broken one.
* ``train.time_limit`` (e.g. ``23h30m``): a deadline per session, counted from the process start
  (imports included): the loop stops before a step would end past it, saves and exits with
  ``EXIT_TIME_LIMIT``. ``train.total_time_limit`` is a budget over all sessions of the run.
* Optional polling of the cloud metadata endpoints that announce a preemption: GCP
  ``instance/preempted`` and AWS ``spot/instance-action``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from voxrelay.checkpoint import host, stops

log = logging.getLogger(__name__)

GCP_METADATA = "http://metadata.google.internal/computeMetadata/v1"
AWS_METADATA = "http://169.254.169.254/latest"


def gcp_preempted(base: str = GCP_METADATA, timeout: float = 1.0) -> bool:
    """True when the GCP metadata server says this (spot/preemptible) VM is being preempted."""
    req = urllib.request.Request(f"{base}/instance/preempted", headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read().decode().strip().upper() == "TRUE"


def aws_preempted(base: str = AWS_METADATA, timeout: float = 1.0) -> bool:
    """True when AWS has scheduled a spot interruption (``spot/instance-action`` exists; IMDSv2)."""
    token_req = urllib.request.Request(
        f"{base}/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    )
    with urllib.request.urlopen(token_req, timeout=timeout) as resp:
        token = resp.read().decode()
    req = urllib.request.Request(f"{base}/meta-data/spot/instance-action", headers={"X-aws-ec2-metadata-token": token})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status == 200
    except urllib.error.HTTPError as err:
        if err.code == 404:  # no interruption scheduled
            return False
        raise


def detect_cloud() -> str | None:
    """'gcp' or 'aws' from the machine's DMI strings (no network), else None."""
    try:
        text = " ".join(
            Path(f"/sys/class/dmi/id/{n}").read_text() for n in ("product_name", "sys_vendor") if
            Path(f"/sys/class/dmi/id/{n}").exists()
        )
    except OSError:
        return None
    if "Google" in text:
        return "gcp"
    if "Amazon" in text:
        return "aws"
    return None


class PreemptionWatcher:
    """Turns signals and metadata notices into ``stop_reason``; the loop checks it every step."""

    def __init__(self, poll: str = "auto", poll_every: float = 5.0, metadata_url: str | None = None):
        self.poll = poll
        self.poll_every = poll_every
        self.metadata_url = metadata_url
        self.stop_reason: str | None = None
        self.noticed_at: float | None = None  # wall time of the signal or notice: grace_seconds counts from it
        self._previous: dict[int, object] = {}
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    def __enter__(self) -> PreemptionWatcher:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        cloud = detect_cloud() if self.poll == "auto" else (None if self.poll == "off" else self.poll)
        if cloud in ("gcp", "aws"):
            probe = gcp_preempted if cloud == "gcp" else aws_preempted
            base = self.metadata_url or (GCP_METADATA if cloud == "gcp" else AWS_METADATA)
            self._thread = threading.Thread(target=self._poll_loop, args=(probe, base), daemon=True,
                                            name="voxrelay-preemption")
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed.set()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.stop_reason is not None and signum == signal.SIGINT:
            # second Ctrl-C: the user wants out now. Nothing half-written is ever committed.
            os.write(2, b"\nvoxrelay: second SIGINT, aborting without saving\n")
            os._exit(stops.EXIT_ABORTED)
        if self.stop_reason is None:
            self._notice(name)
            os.write(2, f"\nvoxrelay: {name} received; finishing the step, saving, then exiting\n".encode())

    def _notice(self, reason: str) -> None:
        if self.stop_reason is None:
            self.noticed_at = time.time()
            self.stop_reason = reason

    def _poll_loop(self, probe: Callable[[str], bool], base: str) -> None:
        while not self._closed.wait(self.poll_every):
            try:
                if probe(base):
                    self._notice("preemption notice from the metadata server")
                    return
            except Exception as err:  # any failure of one poll (refused, reset, a malformed answer): poll again
                log.debug("metadata poll failed: %s: %s", type(err).__name__, err)


TIME_LIMIT, TOTAL_TIME_LIMIT = stops.TIME_LIMIT.reason, stops.TOTAL_TIME_LIMIT.reason


def process_start_time() -> float:
    """Wall-clock time this process started (Linux: from /proc, so interpreter start-up and imports
    count); elsewhere the time voxrelay was first imported."""
    import voxrelay

    return host.started_at(os.getpid()) or voxrelay.IMPORTED_AT


def session_start(time_limit_from: str = "process") -> float:
    """When this session's ``train.time_limit`` started counting: the process start, or with ``boot``
    the machine's (a Colab runtime's VM boots with the runtime; elsewhere the process start)."""
    if time_limit_from == "boot":
        return host.boot_time() or process_start_time()
    return process_start_time()


class Deadline:
    """``session_s`` after the process started (``train.time_limit``) and ``total_s`` of training
    over all sessions (``train.total_time_limit``); either may be None."""

    def __init__(self, session_s: float | None, total_s: float | None, started_at: float):
        self.session_s = session_s
        self.total_s = total_s
        self.started_at = started_at

    def describe(self, source: str, now: float | None = None) -> str | None:
        """The session's limit as a log line: from when it counts and what is left (None: no limit). ``source``:
        train.time_limit_from. A limit already spent when the session starts says why (a machine booted hours
        before the command, counted from its boot)."""
        if self.session_s is None:
            return None
        now = time.time() if now is None else now
        left = self.started_at + self.session_s - now
        since = "the machine's boot" if source == "boot" else "this process's start"
        line = (f"train.time_limit: {_span(self.session_s)} from {since} ({_span(now - self.started_at)} ago), "
                f"{_span(max(left, 0.0))} left")
        if left <= 0:
            line += ("; already spent: this machine booted long before this session (train.time_limit_from=process "
                     "counts from the command instead)" if source == "boot" else "; already spent: raise it")
        return line

    def reached(self, trained_s: float, next_step_s: float) -> str | None:
        """The limit the next step (lasting ``next_step_s``) would cross, if any."""
        if self.session_s is not None and time.time() + next_step_s >= self.started_at + self.session_s:
            return TIME_LIMIT
        if self.total_s is not None and trained_s + next_step_s >= self.total_s:
            return TOTAL_TIME_LIMIT
        return None


def young_daly_interval(save_cost_s: float, mtbf_s: float) -> float:
    """Optimal seconds between checkpoints: sqrt(2 × save cost × mean time between failures)."""
    return (2.0 * max(save_cost_s, 1e-3) * mtbf_s) ** 0.5


class SaveTrigger:
    """Decides when to save: every N steps, N epochs and/or minutes, or adaptively (Young/Daly) from the
    measured blocking cost of saves and the expected mean time between failures. ``epoch``: the epoch the
    data's cursor is in at the start (an epoch ends when the cursor enters the next one)."""

    def __init__(self, every_steps: int | None, every_minutes: float | None, mtbf_s: float | None,
                 every_epochs: int | None = None, epoch: int = 0):
        self.every_steps = every_steps
        self.every_minutes = every_minutes
        self.mtbf_s = mtbf_s
        self.every_epochs = every_epochs
        self.next_epoch = None if every_epochs is None else (epoch // every_epochs + 1) * every_epochs
        self.last_save = time.monotonic()
        self.save_cost_s = 0.0

    def interval_s(self) -> float | None:
        if self.mtbf_s is not None:
            return young_daly_interval(self.save_cost_s, self.mtbf_s)
        return None if self.every_minutes is None else self.every_minutes * 60

    def due(self, step: int, epoch: int = 0) -> bool:
        if self.every_steps is not None and step % self.every_steps == 0:
            return True
        if self.next_epoch is not None and epoch >= self.next_epoch:
            self.next_epoch = (epoch // self.every_epochs + 1) * self.every_epochs
            return True
        interval = self.interval_s()
        return interval is not None and time.monotonic() - self.last_save >= interval

    def saved(self, cost_s: float) -> None:
        self.last_save = time.monotonic()
        # exponential average: one slow save (a cold cache) should not double the interval
        self.save_cost_s = cost_s if self.save_cost_s == 0 else 0.7 * self.save_cost_s + 0.3 * cost_s


def _span(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min" if seconds >= 60 else \
        f"{seconds:.0f} s"
