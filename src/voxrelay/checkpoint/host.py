"""This machine and its processes, from Linux ``/proc`` (None where it cannot be read): when a process
or the machine started, and what tells one machine (boot) and pid namespace from another."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Mapping
from pathlib import Path

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# set in a process started by torchrun (accelerate launch runs torchrun's agent): its launcher is its parent
LAUNCHER_ENV = ("TORCHELASTIC_RUN_ID", "LOCAL_RANK")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine (this pid namespace) exists; another user's counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def boot_time() -> float | None:
    """Wall-clock time this machine (or VM: a Colab runtime) booted."""
    text = _read("/proc/stat") or ""
    found = [line.split()[1] for line in text.splitlines() if line.startswith("btime ")]
    return float(found[0]) if found else None


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` of this machine started, in clock ticks since boot (``/proc/<pid>/stat`` field 22);
    None when there is no such process. Unlike :func:`started_at` it does not move when the wall clock is
    stepped (NTP, a VM resumed), so it tells a live process from a reused pid on its own."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (ValueError, IndexError):
        return None


def started_at(pid: int) -> float | None:
    """Wall-clock time process ``pid`` of this machine started (for display and session limits: it moves with
    the wall clock, via btime); None when there is no such process."""
    ticks, boot = start_ticks(pid), boot_time()
    if ticks is None or boot is None:
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def boot_id() -> str | None:
    """A random id of this boot of this machine (two containers of one host share it)."""
    return _read("/proc/sys/kernel/random/boot_id")


def pid_namespace() -> str | None:
    """This process's pid namespace (``pid:[4026531836]``): pids mean the same only within one."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def set_parent_death_signal(signum: int) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent exits; False where it cannot (not Linux)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum)) == 0
    except (OSError, AttributeError):
        return False


def stop_with_launcher(parent_at_start: int, environ: Mapping[str, str] = os.environ) -> bool:
    """In a process started by torchrun/accelerate: SIGTERM it when its launcher dies (torchrun starts workers in
    sessions of their own, so a SIGKILLed launcher's workers otherwise run on, holding the run's lease), and at
    once if the launcher already died (the parent changed since ``parent_at_start``, read at import) before the
    request was made. Whether it applies here."""
    if not any(key in environ for key in LAUNCHER_ENV):
        return False
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent_at_start:  # it died before we asked: no signal will come
        os.kill(os.getpid(), signal.SIGTERM)
    return True
