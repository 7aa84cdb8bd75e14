"""Streaming a split's rows from their shards as the batch plan needs them, in bounded memory and disk.

:class:`ShardSource` serves rows by their position in the row index (:mod:`voxrelay.data.rowindex`):

- a remote shard is downloaded once per node into the shared disk cache (``$VOXRELAY_CACHE/prepared``, LRU,
  ``cache.max_gb``; the processes of a node share it) by a small pool of threads, ahead of use in the order
  the plan needs them (``cache.prefetch_shards``); a local one is read in place;
- decoded shards are kept in RAM in an LRU of at most ``cache.ram_gb`` per process;
- a download that would leave less than ``cache.min_free_gb`` free on the cache's disk is not cached: the
  shard is read into memory instead, so prefetching never fills the disk checkpoints are staged on.

:class:`StreamBatches` is what :class:`voxrelay.data.loader.BatchStream` calls: the examples of a batch's rows,
collated, and the shards of the next batches to fetch.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from voxrelay import storage
from voxrelay.data import shards as sh
from voxrelay.data.loader import ShardCache
from voxrelay.data.rowindex import RowIndex
from voxrelay.paths import uri_key

log = logging.getLogger(__name__)


class ShardSource:
    """Rows of one split, fetched and decoded shard by shard (see the module's docstring)."""

    def __init__(self, prepared_uri: str, num_codebooks: int, rows: RowIndex, cache: ShardCache, ram_bytes: int,
                 min_free_bytes: int, workers: int = 4):
        self.prepared_uri = prepared_uri
        self.num_codebooks = num_codebooks
        self.rows = rows
        self.cache = cache
        self.ram_bytes = ram_bytes
        self.min_free_bytes = min_free_bytes
        self.workers = workers
        self._decoded: OrderedDict[int, list[sh.EncodedUtterance]] = OrderedDict()
        self._decoded_bytes: dict[int, int] = {}
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()  # the disk cache's bookkeeping, shared by the download threads
        self._pool: ThreadPoolExecutor | None = None
        self.stats = {"downloaded": 0, "cache_hits": 0, "uncached": 0, "decoded": 0}
        self.fetched = [0, 0.0]  # bytes downloaded (or read uncached) and the seconds it took, summed

    @property
    def ram_used(self) -> int:
        return sum(self._decoded_bytes.values())

    def get(self, ids: list[int] | np.ndarray) -> list[sh.EncodedUtterance]:
        """The rows at these row-index positions, in that order."""
        return [self._shard(int(self.rows.shard[i]))[int(self.rows.row[i])] for i in ids]

    def want(self, shards: list[int]) -> None:
        """Start fetching these shards (the plan's next, in order of need) unless held or on their way."""
        for s in shards:
            with self._lock:
                if s not in self._decoded and s not in self._pending:
                    self._pending[s] = self._executor().submit(self._fetch, s)

    def io_stats(self) -> dict[str, float]:
        """``shard_mb_s`` (downloads' MB over their seconds, threads summed: the bucket's rate per stream),
        ``cache_free_gb`` (free disk where shards are cached) and ``shards_uncached`` (read into memory because
        that disk was nearly full)."""
        out = {"shards_uncached": float(self.stats["uncached"])}
        if self.fetched[1] > 0:
            out["shard_mb_s"] = self.fetched[0] / 1e6 / self.fetched[1]
        try:
            out["cache_free_gb"] = shutil.disk_usage(self.cache.root).free / 1e9
        except OSError:
            pass
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._pending.clear()

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="voxrelay-shards")
        return self._pool

    def _shard(self, s: int) -> list[sh.EncodedUtterance]:
        if s in self._decoded:
            self._decoded.move_to_end(s)
            return self._decoded[s]
        with self._lock:
            future = self._pending.pop(s, None)
        data = future.result() if future is not None else self._fetch(s)
        rows = sh.decode_table(data, self.num_codebooks)
        self.stats["decoded"] += 1
        self._decoded[s] = rows
        self._decoded_bytes[s] = sum(r.codes.nbytes + len(r.text) for r in rows)
        while len(self._decoded) > 1 and self.ram_used > self.ram_bytes:
            old, _ = self._decoded.popitem(last=False)
            del self._decoded_bytes[old]
        return rows

    def _local_path(self, s: int) -> Path:
        return self.cache.root / uri_key(self.prepared_uri) / f"{self.rows.shards[s]}.parquet"

    def _fetch(self, s: int) -> bytes:
        """The shard's bytes, from the disk cache (downloaded into it if needed), or straight from storage
        when caching it would leave less than ``min_free_bytes`` on the disk. Bytes, not a path: another
        process may evict the file before it is decoded."""
        uri = sh.shard_uri(self.prepared_uri, self.rows.shards[s])
        if storage.is_local(uri):
            return storage.read_bytes(uri)
        path, size = self._local_path(s), storage.size(uri)
        try:
            if path.stat().st_size == size:
                data = path.read_bytes()
                with self._lock:
                    self.cache.touch(path, size)
                    self.stats["cache_hits"] += 1
                return data
        except FileNotFoundError:
            pass  # not cached, or evicted by another process just now
        path.parent.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(path.parent).free - size < self.min_free_bytes:
            with self._lock:
                self.stats["uncached"] += 1
            log.warning("the disk of %s has under cache.min_free_gb=%.1f free: shard %s is read into memory, "
                        "not cached", path.parent, self.min_free_bytes / 1e9, self.rows.shards[s])
            return self._timed(lambda: storage.read_bytes(uri), size)
        with self._lock:
            hold = self.cache.reserve(path, size)
            self.stats["downloaded"] += 1
        try:
            self._timed(lambda: storage.get_file(uri, path), size)
        finally:
            with self._lock:
                self.cache.settle(hold, path, size)
        try:
            return path.read_bytes()
        except FileNotFoundError:  # evicted by another process at once
            return storage.read_bytes(uri)


    def _timed(self, fetch, size: int):
        t0 = time.perf_counter()
        out = fetch()
        with self._lock:
            self.fetched[0] += size
            self.fetched[1] += time.perf_counter() - t0
        return out


class StreamBatches:
    """``make_batch`` of a :class:`~voxrelay.data.loader.BatchStream` over a :class:`ShardSource`: plan ids ->
    row-index positions (``keep``) -> rows -> the family's examples, collated; ``want`` prefetches the shards of
    the batches that come next (at most ``prefetch`` shards ahead)."""

    def __init__(self, source: ShardSource, keep: np.ndarray, example: Callable, collate: Callable, prefetch: int):
        self.source = source
        self.keep = keep
        self.example = example
        self.collate = collate
        self.prefetch = prefetch

    def __call__(self, ids: list[int]) -> dict:
        rows = self.source.get(self.keep[np.asarray(ids, dtype=np.int64)])
        batch = self.collate([self.example(r) for r in rows])
        batch["audio_seconds"] = sum(r.duration for r in rows)
        return batch

    def want(self, upcoming: list[list[int]]) -> None:
        shards: list[int] = []
        for ids in upcoming:
            for s in self.source.rows.shard[self.keep[np.asarray(ids, dtype=np.int64)]].tolist():
                if s not in shards:
                    shards.append(s)
            if len(shards) >= self.prefetch:
                break
        self.source.want(shards[: max(self.prefetch, 1)])

    def close(self) -> None:
        self.source.close()

    def io_stats(self) -> dict[str, float]:
        return self.source.io_stats()

    @property
    def where(self) -> str:
        return self.source.prepared_uri
