"""The node's local copies of remote shards: ``$VOXRELAY_CACHE/prepared/`` (all prepared datasets), at most
``cache.max_gb``, least recently used evicted, shared by the processes of a machine."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat
import threading
import time
from collections import OrderedDict
from pathlib import Path

from voxrelay import storage

log = logging.getLogger(__name__)


class ShardCache:
    """Local copies of remote shards under ``root``, at most ``max_bytes``.

    A use touches the file's times (the LRU clock of later scans); room is made by deleting the least
    recently used files, never those in ``in_use`` (the split being loaded whole: a split larger than the cap
    is still loaded, with a warning). Room for a download is reserved under a lock of the folder, from a fresh
    scan of it, with a sparse placeholder that the other processes' scans count, so downloads in flight
    together, from any process of the node, stay under the cap. A download that would leave less than
    ``min_free_bytes`` on the disk is read into memory instead of cached. Another process may evict a file
    between our check and our read: then it is read from storage. Safe to call from several threads.
    """

    def __init__(self, root: Path, max_bytes: int, min_free_bytes: int = 0):
        self.root = root
        self.max_bytes = max_bytes
        self.min_free_bytes = min_free_bytes
        self._lru: OrderedDict[Path, int] | None = None  # path -> bytes, least recently used first
        self._bytes = 0
        self._warned = False
        self._mutex = threading.Lock()  # the bookkeeping below, shared by download threads
        self.stats = {"downloaded": 0, "cache_hits": 0, "uncached": 0}
        self.fetched = [0, 0.0]  # bytes downloaded (or read uncached) and the seconds it took, summed

    def read(self, uri: str, path: Path, in_use: frozenset[Path] | set[Path] = frozenset()) -> bytes:
        """The bytes of ``uri``, from its copy at ``path`` (downloaded there first when missing or stale)."""
        size = storage.size(uri)
        try:
            if path.stat().st_size == size:
                os.utime(path)
                data = path.read_bytes()
                with self._mutex:
                    self._touched(path, size)
                    self.stats["cache_hits"] += 1
                return data
        except FileNotFoundError:
            pass  # not cached, or evicted by another process just now
        path.parent.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(path.parent).free - size < self.min_free_bytes:
            with self._mutex:
                self.stats["uncached"] += 1
            log.warning("the disk of %s has under cache.min_free_gb=%.1f free: %s is read into memory, not cached",
                        path.parent, self.min_free_bytes / 1e9, uri)
            return self._timed(lambda: storage.read_bytes(uri), size)
        hold = self._reserve(path, size, in_use)
        try:
            self._timed(lambda: storage.get_file(uri, path), size)
        finally:
            self._settle(hold, path, size)
        try:
            return path.read_bytes()
        except FileNotFoundError:  # evicted by another process at once: read it from storage
            return storage.read_bytes(uri)

    def _timed(self, fetch, size: int):
        t0 = time.perf_counter()
        out = fetch()
        with self._mutex:
            self.fetched[0] += size
            self.fetched[1] += time.perf_counter() - t0
        return out

    def _reserve(self, path: Path, size: int, in_use) -> Path:
        """Evict for ``size`` more bytes and hold them with ``<path>.reserved`` until :meth:`_settle`."""
        hold = path.with_name(path.name + ".reserved")
        with self._mutex, open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._lru = None  # a fresh scan: the node's other processes fill the folder too
            self.make_room(size, in_use)
            with open(hold, "wb") as f:
                f.truncate(size)
            self._touched(hold, size)
            self.stats["downloaded"] += 1
        return hold

    def _settle(self, hold: Path, path: Path, size: int) -> None:
        with self._mutex:
            self._bytes -= self._entries().pop(hold, 0)
            hold.unlink(missing_ok=True)
            self._touched(path, size)

    def _entries(self) -> OrderedDict[Path, int]:
        if self._lru is None:
            found = []
            for path in self.root.rglob("*"):
                if ".part-" in path.name or path.name == ".lock":
                    continue  # a download in flight (another process)
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    found.append((max(st.st_mtime, st.st_atime), path, st.st_size))
            self._lru = OrderedDict((path, size) for _, path, size in sorted(found))
            self._bytes = sum(self._lru.values())
        return self._lru

    def _touched(self, path: Path, size: int) -> None:
        lru = self._entries()
        self._bytes += size - lru.pop(path, 0)
        lru[path] = size

    def make_room(self, incoming: int, in_use) -> None:
        """Delete least recently used files (not ``in_use``) until ``incoming`` more bytes fit under the cap."""
        lru = self._entries()
        if self._bytes + incoming <= self.max_bytes:
            return
        for path in [p for p in lru if p not in in_use]:
            if self._bytes + incoming <= self.max_bytes:
                return
            path.unlink(missing_ok=True)
            self._bytes -= lru.pop(path)
            log.info("prepared cache: evicted %s (least recently used; cache.max_gb)", path)
        if self._bytes + incoming > self.max_bytes and not self._warned:
            self._warned = True
            log.warning(
                "the prepared split being loaded needs more local cache than cache.max_gb=%.2f allows "
                "(%.2f GiB in %s); it is loaded anyway: raise cache.max_gb if this disk has room",
                self.max_bytes / 2**30, (self._bytes + incoming) / 2**30, self.root,
            )
