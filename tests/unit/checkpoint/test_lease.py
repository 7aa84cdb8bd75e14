"""The run lease (voxrelay.checkpoint.lease) on a local folder, S3 (moto) and GCS (fake-gcs-server):
one holder at a time, refused with the holder named, free once released, expired or its process gone,
taken over with fencing."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers.metadata import FIXTURES
from voxrelay import storage
from voxrelay.checkpoint import host
from voxrelay.checkpoint.lease import (
    LeaseHeld,
    LeaseLost,
    LeaseUnsafe,
    LeaseWatch,
    RunLease,
    check_root_for_leases,
    lease_state,
    read_lease,
)
from voxrelay.errors import UserError
from voxrelay.storage.mounts import root_mount, root_mount_kind


class Clock:
    """Forced time: ``t`` the wall clock, ``m`` a monotonic one; :meth:`pause` (a lease's waits) advances both
    and then runs what is due meanwhile (another session's renewals), so no test sleeps."""

    def __init__(self, t: float = 1_000_000.0):
        self.t, self.m = t, 0.0
        self.due: list = []

    def __call__(self) -> float:
        return self.t

    def mono(self) -> float:
        return self.m

    def pause(self, seconds: float) -> None:
        self.t, self.m = self.t + seconds, self.m + seconds
        for call in self.due:
            call()

    def lease(self, run: str, ttl: float, ahead_s: float = 0.0) -> RunLease:
        """A session whose wall clock runs ``ahead_s`` ahead of this one; one monotonic rate for all."""
        return RunLease(run, ttl, lambda: self.t + ahead_s, LeaseWatch(self.mono), self.pause)

    def renewing(self, holder: RunLease, every: float) -> None:
        """``holder`` renews every ``every`` seconds from now on (a live trainer on another machine)."""
        last = [self.m]

        def tick() -> None:
            if self.m - last[0] >= every:
                holder.renew()
                last[0] = self.m
        self.due.append(tick)


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
    first, second = clock.lease(run, 60), clock.lease(run, 60)
    assert first.acquire() is None
    clock.renewing(first, 20)
    with pytest.raises(LeaseHeld) as held:
        second.acquire()  # watched until the holder renewed it
    msg = str(held.value)
    assert f"host {socket.gethostname()}, pid {os.getpid()}" in msg and clock.m < 60
    assert "renewed while this one watched" in msg and "renewal #" in msg and "--take-over" in msg and run in msg
    clock.due.clear()
    first.renew()  # still ours
    first.release()
    assert read_lease(run)["released"] is True
    assert second.acquire() is None and read_lease(run)["token"] == second.record["token"]
    with pytest.raises(LeaseLost):
        first.check()  # released and taken by another: never ours again


def test_expired_lease_is_taken_and_the_old_holder_is_fenced(run: str) -> None:
    clock = Clock()
    first, second = clock.lease(run, 30), clock.lease(run, 30)
    first.acquire()
    assert "expired" in second.acquire()  # no renewal seen for the lease's 30 s: its holder is presumed gone
    assert 30 <= clock.m <= 40
    assert read_lease(run)["taken_from"]["state"] == "expired"
    for call in (first.check, first.renew):
        with pytest.raises(LeaseLost, match="another session took over"):
            call()
    second.check()  # the new holder goes on


def test_take_over_of_a_live_lease_fences_it_and_waits_out_its_expiry(run: str) -> None:
    first, second = RunLease(run, 0.5), RunLease(run, 0.5)
    first.acquire()
    clock = Clock()
    clock.renewing(first, 0.15)
    with pytest.raises(LeaseHeld):
        clock.lease(run, 0.5).acquire()
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

    first, second = RunLease(run, 0.6), RunLease(run, 0.6)
    first.acquire()
    second.acquire(take_over=True)
    assert read_lease(run)["token"] == second.record["token"]
    assert read_lease(run)["expires"] - time.time() > 0.3  # renewed when the wait ended
    clock = Clock()
    clock.renewing(second, 0.2)
    with pytest.raises(LeaseHeld):
        clock.lease(run, 0.6).acquire()
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


@on("local", "s3", "gcs")
def test_a_contender_whose_clock_runs_ahead_does_not_take_a_renewing_lease(run: str) -> None:
    """Issue 33 D2: ttl 9 s, the contender's wall clock 7 s ahead, 2 s after a renewal: live, refused."""
    clock = Clock()
    holder, contender = clock.lease(run, 9), clock.lease(run, 9, ahead_s=7)
    holder.acquire()
    clock.pause(3)
    holder.renew()
    clock.pause(2)
    clock.renewing(holder, 3)
    with pytest.raises(LeaseHeld):
        contender.acquire()
    assert read_lease(run)["token"] == holder.record["token"]
    holder.check()  # still ours


@on("local", "s3", "gcs")
def test_a_silent_lease_is_taken_after_its_ttl_whatever_the_clocks_say(run: str) -> None:
    """A holder that stops renewing (its machine gone) loses the lease after its ttl on the contender's own
    clock, even when the contender's wall clock runs far behind (the record's expiry still in its future)."""
    clock = Clock()
    holder, contender = clock.lease(run, 9), clock.lease(run, 9, ahead_s=-3600)
    holder.acquire()
    assert "expired" in contender.acquire()
    assert 9 <= clock.m <= 12
    with pytest.raises(LeaseLost):
        holder.check()


def test_a_check_after_release_does_not_take_the_lease_again(run: str) -> None:
    """Issue 33 L1."""
    clock = Clock()
    lease = clock.lease(run, 30)
    lease.acquire()
    lease.release()
    clock.pause(25)  # past a third of the lease: a check would renew a lease it still held
    with pytest.raises(LeaseLost, match="released"):
        lease.check()
    with pytest.raises(LeaseLost):
        lease.renew()
    assert read_lease(run)["released"] is True


def test_a_wall_clock_step_does_not_make_a_live_holder_of_this_machine_look_dead(run, monkeypatch) -> None:
    """Issue 33 L2: btime (and so a wall-clock start time) moves when the clock is stepped; ticks do not."""
    holder = RunLease(run, 60)
    holder.acquire()
    record = read_lease(run)
    real = host.boot_time()
    monkeypatch.setattr(host, "boot_time", lambda: real + 3600)  # NTP stepped the clock an hour forward
    assert lease_state(record, 0.0, 60) == "live"
    assert lease_state(record | {"start_ticks": record["start_ticks"] + 1}, 0.0, 60) == "dead"  # a reused pid


def test_a_hung_trainer_lets_its_lease_expire(run: str) -> None:
    """Issue 33 H2: renewed while training reports progress; a trainer stuck (an Event never set) stops renewing
    once the progress bound passes, and another session takes the run after the lease's ttl."""
    clock = Clock()
    lease = clock.lease(run, 9)
    lease.acquire()
    lease.progress()
    reached, never = threading.Event(), threading.Event()

    def trainer() -> None:
        lease.progress()  # a step
        reached.set()
        never.wait()  # hung: a collective that never returns

    threading.Thread(target=trainer, daemon=True).start()
    assert reached.wait(60)
    clock.pause(lease.progress_s - 1)
    assert lease.renew_if_progressing() is True  # within the bound: renewed
    clock.pause(2)
    seq = read_lease(run)["seq"]
    assert lease.renew_if_progressing() is False  # past it: left to expire
    assert read_lease(run)["seq"] == seq
    assert "expired" in clock.lease(run, 9).acquire()


def test_a_root_whose_store_ignores_conditional_creates_is_refused_for_leases(tmp_path) -> None:
    """Issue 33 D5: exit 2 (a UserError) with the reason and the fix."""
    root = str(tmp_path / "root")
    plain = functools.partial(storage.ignores_conditional_create, create=storage.write_bytes)
    with pytest.raises(LeaseUnsafe, match="ignores the condition.*both win it") as refused:
        check_root_for_leases(root, None, probe=plain)
    assert isinstance(refused.value, UserError)
    assert check_root_for_leases(root, None) is None  # a local folder refuses the second create


def test_a_root_on_a_fuse_mount_is_refused_for_leases_unless_one_machine_trains_it() -> None:
    """Issue 33 D5: Colab's Google Drive (seed 002's root) and gcsfuse (seed 000's), from a recorded /proc/mounts of
    a Colab VM. O_EXCL there excludes only this machine: refused (exit 2) with both ways out, before any probe;
    with checkpoint.single_machine the run trains, warned."""
    mounts = str(FIXTURES / "proc_mounts_colab.txt")
    assert root_mount_kind("/content/drive/MyDrive/tts", mounts) == "Google Drive"
    assert root_mount("gs://b/voxrelay", mounts) is None and root_mount("/tmp/voxrelay", mounts) is None
    probed: list[str] = []

    def probe(root: str) -> None:
        probed.append(root)

    drive = root_mount("/content/drive/MyDrive/tts", mounts)
    with pytest.raises(LeaseUnsafe, match="Google Drive mount.*another machine.*checkpoint.single_machine=true"):
        check_root_for_leases("/content/drive/MyDrive/tts", drive, probe=probe)
    gcs = root_mount("/content/gcs/voxrelay", mounts)
    with pytest.raises(LeaseUnsafe, match=r"set root=gs://tts-colab-data/voxrelay \(the bucket itself\)"):
        check_root_for_leases("/content/gcs/voxrelay", gcs, probe=probe)
    assert probed == []
    said = check_root_for_leases("/content/drive/MyDrive/tts", drive, single_machine=True, probe=probe)
    assert "Google Drive mount" in said and "another machine" in said and probed == ["/content/drive/MyDrive/tts"]
    # a store ignoring the condition is refused whatever the user states
    with pytest.raises(LeaseUnsafe, match="cannot hold a run's lease"):
        check_root_for_leases("/content/gcs/voxrelay", gcs, single_machine=True, probe=lambda _root: "it ignores")
