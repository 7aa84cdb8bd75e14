"""The run lease (voxrelay.checkpoint.lease) on a local folder, S3 (moto) and GCS (fake-gcs-server):
one holder at a time, refused with the holder named, free once released, expired or its process gone,
taken over with fencing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from voxrelay import storage
from voxrelay.checkpoint.lease import LeaseHeld, LeaseLost, RunLease, read_lease


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def run(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    kind = getattr(request, "param", "local")
    base = str(tmp_path / "root") if kind == "local" else request.getfixturevalue(f"{kind}_root")
    return storage.join(base, "runs", "r")


def on(*kinds: str):
    return pytest.mark.parametrize("run", kinds, indirect=True)


@on("local", "s3", "gcs")
def test_one_holder_refused_names_it_then_free_once_released(run: str) -> None:
    clock = Clock()
    first, second = RunLease(run, 60, clock), RunLease(run, 60, clock)
    assert first.acquire() is None
    clock.t += 5
    with pytest.raises(LeaseHeld) as held:
        second.acquire()
    msg = str(held.value)
    assert f"host {socket.gethostname()}, pid {os.getpid()}" in msg
    assert "renewed 5 s ago, expires in 55 s" in msg and "--take-over" in msg and run in msg
    first.renew()  # still ours
    first.release()
    assert read_lease(run)["released"] is True
    assert second.acquire() is None and read_lease(run)["token"] == second.record["token"]
    with pytest.raises(LeaseLost):
        first.check()  # released and taken by another: never ours again


def test_expired_lease_is_taken_and_the_old_holder_is_fenced(run: str) -> None:
    clock = Clock()
    first, second = RunLease(run, 30, clock), RunLease(run, 30, clock)
    first.acquire()
    clock.t += 31  # no renewal for longer than the lease: its holder is presumed gone
    assert "expired" in second.acquire()
    assert read_lease(run)["taken_from"]["state"] == "expired"
    for call in (first.check, first.renew):
        with pytest.raises(LeaseLost, match="another session took over"):
            call()
    second.check()  # the new holder goes on


def test_take_over_of_a_live_lease_fences_it_and_waits_out_its_expiry(run: str) -> None:
    first, second = RunLease(run, 0.5), RunLease(run, 0.5)
    first.acquire()
    with pytest.raises(LeaseHeld):
        second.acquire()
    assert "live" in second.acquire(take_over=True)
    old_expiry = first.record["expires"]
    import time

    assert time.time() >= old_expiry  # waited until the old lease ran out before going on
    with pytest.raises(LeaseLost):
        first.check()


def test_a_lease_taken_over_from_a_live_holder_is_fresh_when_the_wait_ends(run: str) -> None:
    """The wait for the old holder's expiry must not eat the new holder's own lease: a third session
    starting right after must find it live (not expired), with a whole lease left."""
    import time

    first, second, third = RunLease(run, 0.6), RunLease(run, 0.6), RunLease(run, 0.6)
    first.acquire()
    second.acquire(take_over=True)
    assert read_lease(run)["token"] == second.record["token"]
    assert read_lease(run)["expires"] - time.time() > 0.3  # renewed when the wait ended
    with pytest.raises(LeaseHeld):
        third.acquire()
    second.check()


HOLD_AND_DIE = """
import os, sys
from voxrelay.checkpoint.lease import RunLease
RunLease(sys.argv[1], 3600).acquire()
os._exit(0)  # like a SIGKILL: no release
"""


def test_a_holder_gone_from_this_machine_is_taken_over_at_once(run: str) -> None:
    subprocess.run([sys.executable, "-c", HOLD_AND_DIE, run], check=True, env=os.environ.copy(), timeout=60)
    left = read_lease(run)
    assert left["released"] is False and left["pid"] != os.getpid()
    assert "dead" in RunLease(run, 60).acquire()  # not an hour's wait


def test_renewal_thread_keeps_it_and_stops_at_release(run: str) -> None:
    lease = RunLease(run, 0.3)
    lease.acquire()
    seq = lease.record["seq"]
    lease.start_renewing()
    renewed = threading.Event()
    while not renewed.wait(0.05):  # a poll, bounded by the test timeout
        if read_lease(run)["seq"] >= seq + 2:
            renewed.set()
    lease.release()
    assert read_lease(run)["released"] is True
    assert RunLease(run, 60).acquire() is None
