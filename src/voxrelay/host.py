"""This machine and its processes, from Linux ``/proc`` (None where it cannot be read): when a process
or the machine started, and what tells one machine (boot) and pid namespace from another."""

from __future__ import annotations

import os
from pathlib import Path


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def boot_time() -> float | None:
    """Wall-clock time this machine (or VM: a Colab runtime) booted."""
    text = _read("/proc/stat") or ""
    found = [line.split()[1] for line in text.splitlines() if line.startswith("btime ")]
    return float(found[0]) if found else None


def started_at(pid: int) -> float | None:
    """Wall-clock time process ``pid`` of this machine started; None when there is no such process."""
    stat, boot = _read(f"/proc/{pid}/stat"), boot_time()
    if stat is None or boot is None:
        return None
    try:
        return boot + int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")  # field 22: in ticks
    except (ValueError, IndexError):
        return None


def boot_id() -> str | None:
    """A random id of this boot of this machine (two containers of one host share it)."""
    return _read("/proc/sys/kernel/random/boot_id")


def pid_namespace() -> str | None:
    """This process's pid namespace (``pid:[4026531836]``): pids mean the same only within one."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
