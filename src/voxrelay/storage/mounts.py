"""Where a local root really lives: the mounts of this machine (``/proc/mounts``), and whether a folder lies on a
FUSE mount of a remote store (gcsfuse, Colab's Google Drive), where a run's lease cannot exclude another machine
(:func:`voxrelay.checkpoint.lease.check_root_for_leases`) and ``voxrelay doctor`` warns."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from voxrelay.storage.core import is_local, local_path

MOUNTS_FILE = "/proc/mounts"
MOUNTS_ENV = "VOXRELAY_MOUNTS_FILE"  # another mounts table to read (tests: a recorded Colab /proc/mounts)


def mounts_file() -> str:
    return os.environ.get(MOUNTS_ENV) or MOUNTS_FILE


@dataclass(frozen=True)
class Mount:
    """One line of /proc/mounts: ``device`` (for gcsfuse: the bucket), mount ``point``, ``fstype``."""

    device: str
    point: str
    fstype: str


def _unescape(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as octal escapes (\040 ...)
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> list[Mount]:
    """The lines of a /proc/mounts text as :class:`Mount` records (malformed lines skipped)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            out.append(Mount(_unescape(parts[0]), _unescape(parts[1]), parts[2]))
    return out


def read_mounts(path: str | None = None) -> list[Mount]:
    """This machine's mounts, from ``path`` (default :func:`mounts_file`) ([] where it cannot be read: not Linux)."""
    try:
        return parse_mounts(Path(path or mounts_file()).read_text())
    except OSError:
        return []


def mount_of(path: str | Path, mounts: list[Mount]) -> Mount | None:
    """The mount a local ``path`` (existing or not: its nearest existing parent) lies on: the longest mount
    point above it (symlinks resolved)."""
    resolved = Path(os.path.realpath(path))
    best: Mount | None = None
    for m in mounts:
        point = Path(m.point)
        if (resolved == point or point in resolved.parents) and (best is None or len(m.point) > len(best.point)):
            best = m
    return best


def mount_kind(m: Mount | None) -> str | None:
    """``gcsfuse``, ``Google Drive`` or ``FUSE`` for a mounted remote folder; None for a local disk."""
    if m is None:
        return None
    if m.fstype == "fuse.gcsfuse" or m.device == "gcsfuse":
        return "gcsfuse"
    if "drive" in m.fstype.lower() or m.point.startswith("/content/drive"):
        return "Google Drive"
    return "FUSE" if m.fstype.startswith("fuse") else None


def root_mount(root: str, table: str | None = None) -> Mount | None:
    """The FUSE mount a local ``root`` lies on (:func:`mount_kind` not None), by the mounts ``table`` (default:
    :func:`read_mounts`'); None for a bucket or a local disk."""
    if not is_local(root):
        return None
    mount = mount_of(local_path(root), read_mounts(table))
    return mount if mount_kind(mount) is not None else None


def root_mount_kind(root: str, table: str | None = None) -> str | None:
    """:func:`mount_kind` of the mount a local ``root`` lies on; None for a bucket URI or a local disk."""
    return mount_kind(root_mount(root, table))


def gcsfuse_uri(root: str, mount: Mount | None) -> str | None:
    """The gs:// URI of a local ``root`` inside a gcsfuse mount (whose device is the bucket's name), else None."""
    if mount is None or mount_kind(mount) != "gcsfuse" or mount.device == "gcsfuse":
        return None
    rel = Path(local_path(root)).resolve().relative_to(Path(mount.point))
    return f"gs://{mount.device}" + ("" if rel == Path(".") else f"/{rel.as_posix()}")
