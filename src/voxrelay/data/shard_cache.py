"""The node's local copies of remote shards: ``$VOXRELAY_CACHE/prepared/`` (all prepared datasets), at most
``cache.max_gb``, least recently used evicted, shared by the processes of a machine."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import stat
import threading
import time
from collections import OrderedDict
from pathlib import Path

from voxrelay import storage
from voxrelay.checkpoint.host import pid_alive

log = logging.getLogger(__name__)

MARKER = ".reserved"  # ``<shard>.reserved``: "<pid> <bytes>", a download in flight on this node
PART = ".part-"  # ``<shard>.part-<pid>``: the bytes of a download in flight (see storage.get_file)
WAIT_S = 600.0  # the longest a process waits for another process of the node to download a shard
POLL_S = 0.05
WAIT = object()  # :meth:`ShardCache._claim`: another process of the node downloads it


class ShardCache:
    """Local copies of remote shards under ``root``, at most ``max_bytes``.

    A use touches the file's times (the LRU clock of later scans); room is made by deleting the least
    recently used files, never those in ``in_use`` (the split being loaded whole: a split larger than the cap
    is still loaded, with a warning). A download is claimed under a lock of the folder, from a fresh scan of
    it, with an in-flight marker (``<shard>.reserved``: owner pid and size): one download per shard per node,
    the node's other processes wait for it (at most ``wait_seconds``, then read it into memory), and the bytes
    still to come of every download in flight count against ``max_bytes`` and ``min_free_bytes``. A download
    that would leave less than ``min_free_bytes`` on the disk, or whose write fails (ENOSPC, any OSError), is
    read into memory instead of cached. Markers and ``.part-<pid>`` files of dead processes are removed by
    the scan. A hit is checked against the shard's sha256 from index.json where prepare recorded one (its
    size otherwise). Another process may evict a file between our check and our read: then it is read from
    storage. Safe to call from several threads.
    """

    def __init__(self, root: Path, max_bytes: int, min_free_bytes: int = 0, wait_seconds: float = WAIT_S):
        self.root = root
        self.max_bytes = max_bytes
        self.min_free_bytes = min_free_bytes
        self.wait_seconds = wait_seconds
        self._lru: OrderedDict[Path, int] | None = None  # path -> bytes, least recently used first
        self._bytes = 0
        self._inflight = 0  # bytes of the node's downloads in flight (at the last scan)
        self._to_come = 0  # of those, the bytes not yet on the disk
        self._warned = False
        self._warned_uncached = False
        self._mutex = threading.Lock()  # the bookkeeping below, shared by download threads
        self.stats = {"downloaded": 0, "cache_hits": 0, "uncached": 0}
        self.fetched = [0, 0.0]  # bytes downloaded (or read uncached) and the seconds it took, summed

    def read(self, uri: str, path: Path, in_use: frozenset[Path] | set[Path] = frozenset(),
             sha256: str | None = None) -> bytes:
        """The bytes of ``uri``, from its copy at ``path`` (downloaded there first when missing, stale or not
        matching ``sha256``)."""
        size = storage.size(uri)
        data = self._hit(path, size, sha256)
        if data is not None:
            return data
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            marker = self._claim(path, size, in_use)
        except OSError as err:  # a full, read-only or failing cache disk: not even a marker fits
            return self._uncached(uri, size, f"the cache at {self.root} cannot be written ({err})")
        if marker is WAIT:
            self._await(path)
            data = self._hit(path, size, sha256)
            return data if data is not None else self._uncached(
                uri, size, f"another process of this node did not finish downloading {path.name}")
        if marker is None:
            return self._uncached(uri, size, f"the disk of {path.parent} has under cache.min_free_gb="
                                             f"{self.min_free_bytes / 1e9:.1f} free (downloads in flight counted)")
        try:
            self._timed(lambda: self._download(uri, path), size)
        except OSError as err:  # no room (ENOSPC), a read-only or failing disk: the cache is an optimisation
            return self._uncached(uri, size, f"writing {path} failed ({err})")
        finally:
            self._settle(marker, path, size)
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # evicted by another process at once: read it from storage
            return storage.read_bytes(uri)
        if sha256 and hashlib.sha256(data).hexdigest() != sha256:
            raise storage.StorageError(f"{uri} does not match its sha256 in index.json ({sha256[:12]}…): the "
                                       "prepared data changed under this run; run `voxrelay prepare` again")
        return data

    def _hit(self, path: Path, size: int, sha256: str | None) -> bytes | None:
        try:
            if path.stat().st_size != size:
                return None
            os.utime(path)
            data = path.read_bytes()
        except FileNotFoundError:
            return None  # not cached, or evicted by another process just now
        if sha256 and hashlib.sha256(data).hexdigest() != sha256:
            log.warning("the cached copy %s does not match its sha256 in index.json (a damaged disk, or a copy "
                        "cut short by a crash): it is downloaded again", path)
            path.unlink(missing_ok=True)
            return None
        with self._mutex:
            self._touched(path, size)
            self.stats["cache_hits"] += 1
        return data

    def _download(self, uri: str, path: Path) -> None:
        """``uri`` to ``path``: through ``<path>.part-<pid>``, on the disk (fsync) before its name is."""
        tmp = path.with_name(f"{path.name}{PART}{os.getpid()}")
        try:
            storage.get_file(uri, tmp)
            storage.fsync_file(tmp)  # a crash after the rename never leaves a complete-looking torn copy
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def _uncached(self, uri: str, size: int, why: str) -> bytes:
        with self._mutex:
            self.stats["uncached"] += 1
            first, self._warned_uncached = not self._warned_uncached, True
        (log.warning if first else log.info)("%s: %s is read into memory, not cached%s", why, uri,
                                              " (said once; later ones are logged at info)" if first else "")
        return self._timed(lambda: storage.read_bytes(uri), size)

    def _timed(self, fetch, size: int):
        t0 = time.perf_counter()
        out = fetch()
        with self._mutex:
            self.fetched[0] += size
            self.fetched[1] += time.perf_counter() - t0
        return out

    def _claim(self, path: Path, size: int, in_use):
        """Under the node's lock: :data:`WAIT` (in flight or done by another process), None (no room on the
        disk), or the in-flight marker this process now holds (room made for ``size`` more bytes)."""
        marker = path.with_name(path.name + MARKER)
        with self._mutex, open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._lru = None  # a fresh scan: the node's other processes fill the folder too
            self._entries()
            if marker.exists() or _size(path) == size:
                return WAIT
            if shutil.disk_usage(path.parent).free - self._to_come - size < self.min_free_bytes:
                return None
            self.make_room(size, in_use)
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(f"{os.getpid()} {size}")
            except OSError:
                marker.unlink(missing_ok=True)
                raise
            self._inflight += size
            self.stats["downloaded"] += 1
        return marker

    def _await(self, path: Path) -> None:
        """Wait (at most ``wait_seconds``) until the download another process holds ends, or its owner dies."""
        marker = path.with_name(path.name + MARKER)
        deadline = time.monotonic() + self.wait_seconds
        while (owner := _marker(marker)) is not None and pid_alive(owner[0]):
            if time.monotonic() > deadline:
                log.warning("waited %.0f s for process %d of this node to download %s", self.wait_seconds,
                            owner[0], path)
                return
            time.sleep(POLL_S)

    def _settle(self, marker: Path, path: Path, size: int) -> None:
        with self._mutex:
            marker.unlink(missing_ok=True)
            self._inflight -= size
            if path.exists():
                self._touched(path, size)

    def _entries(self) -> OrderedDict[Path, int]:
        if self._lru is None:
            found, flights, inflight, to_come = [], [], 0, 0
            for path in self.root.rglob("*"):
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                if path.name == ".lock" or not stat.S_ISREG(st.st_mode):
                    continue
                if PART in path.name or path.name.endswith(MARKER):
                    flights.append((path, self._in_flight(path, st)))
                    continue
                found.append((max(st.st_mtime, st.st_atime), path, st.st_size))
            self._lru = OrderedDict((path, size) for _, path, size in sorted(found))
            for path, held in flights:
                # a download renamed into place whose marker its owner has not removed yet (_settle comes right
                # after the rename): its bytes are the file's, counted above; counted twice they made room for
                # nothing and evicted the shard just downloaded (seen as a flaky prefetch under a loaded CPU)
                if path.name.endswith(MARKER) and self._lru.get(path.with_name(path.name[: -len(MARKER)])) == held[0]:
                    continue
                inflight += held[0]
                to_come += held[1]
            self._bytes = sum(self._lru.values())
            self._inflight, self._to_come = inflight, to_come
        return self._lru

    def _in_flight(self, path: Path, st: os.stat_result) -> tuple[int, int]:
        """(bytes counted against the cap, bytes not yet on the disk) of a marker or a ``.part-`` file; one
        whose owner died (a SIGKILL mid-download) is removed."""
        if path.name.endswith(MARKER):
            owner = _marker(path)
            stale = owner is None or not pid_alive(owner[0]) or time.time() - st.st_mtime > self.wait_seconds
            if not stale:
                part = path.with_name(path.name[: -len(MARKER)] + f"{PART}{owner[0]}")
                written = _allocated(part) + _allocated(part.with_name(f"{part.name}{PART}{owner[0]}"))
                return owner[1], max(0, owner[1] - written)
        else:
            pid = path.name.rsplit(PART, 1)[1]
            stale = not pid.isdigit() or not pid_alive(int(pid))
            if not stale:  # its bytes are in its marker's count, or (no marker) on the disk already
                return (0 if path.with_name(path.name.split(PART)[0] + MARKER).exists() else st.st_blocks * 512), 0
        path.unlink(missing_ok=True)
        log.info("prepared cache: removed %s (left by a process that died mid-download)", path)
        return 0, 0

    def _touched(self, path: Path, size: int) -> None:
        lru = self._entries()
        self._bytes += size - lru.pop(path, 0)
        lru[path] = size

    def make_room(self, incoming: int, in_use) -> None:
        """Delete least recently used files (not ``in_use``) until ``incoming`` more bytes fit under the cap
        (with the node's downloads in flight)."""
        lru = self._entries()
        if self._bytes + self._inflight + incoming <= self.max_bytes:
            return
        for path in [p for p in lru if p not in in_use]:
            if self._bytes + self._inflight + incoming <= self.max_bytes:
                return
            path.unlink(missing_ok=True)
            self._bytes -= lru.pop(path)
            log.info("prepared cache: evicted %s (least recently used; cache.max_gb)", path)
        if self._bytes + self._inflight + incoming > self.max_bytes and not self._warned:
            self._warned = True
            log.warning(
                "the prepared split being loaded needs more local cache than cache.max_gb=%.2f allows "
                "(%.2f GiB in %s); it is loaded anyway: raise cache.max_gb if this disk has room",
                self.max_bytes / 2**30, (self._bytes + self._inflight + incoming) / 2**30, self.root,
            )


def _marker(path: Path) -> tuple[int, int] | None:
    """(owner pid, bytes) of an in-flight marker; None when it is gone or unreadable (cut short)."""
    try:
        pid, size = path.read_text().split()
        return int(pid), int(size)
    except (FileNotFoundError, ValueError):
        return None


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


def _allocated(path: Path) -> int:
    try:
        return path.stat().st_blocks * 512
    except FileNotFoundError:
        return 0
