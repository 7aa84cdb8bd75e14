"""Streaming a split's rows from their shards as the batch plan needs them, in bounded memory and disk.

:class:`ShardSource` serves rows by their position in the row index (:mod:`voxrelay.data.rowindex`):

- a remote shard is downloaded once per node (the node's other processes wait for that download) into the
  shared disk cache (``$VOXRELAY_CACHE/prepared``, LRU, ``cache.max_gb``) by a small pool of threads, ahead of
  use in the order the plan needs them (``cache.prefetch_shards``); a local one is read in place;
- decoded shards are kept in RAM in an LRU of at most ``cache.ram_gb`` per process;
- a download that would leave less than ``cache.min_free_gb`` free on the cache's disk (the node's downloads in
  flight counted), or whose write fails (ENOSPC: the disk filled by something else meanwhile), is not cached: the
  shard is read into memory instead, so prefetching never fills the disk checkpoints are staged on and a full
  disk never reaches the training loop (:class:`~voxrelay.data.shard_cache.ShardCache`).

:class:`StreamBatches` is what :class:`voxrelay.data.loader.BatchStream` calls: the examples of a batch's rows,
collated, and the shards of the next batches to fetch.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait

import numpy as np

from voxrelay import storage
from voxrelay.data import shards as sh
from voxrelay.data.rowindex import RowIndex
from voxrelay.data.shard_cache import ShardCache
from voxrelay.paths import uri_key

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 60.0  # the longest :meth:`ShardSource.close` waits for downloads already running


class ShardSource:
    """Rows of one split, fetched and decoded shard by shard (see the module's docstring)."""

    def __init__(self, prepared_uri: str, num_codebooks: int, rows: RowIndex, cache: ShardCache, ram_bytes: int,
                 workers: int = 4, close_wait_s: float = CLOSE_WAIT_S):
        self.prepared_uri = prepared_uri
        self.num_codebooks = num_codebooks
        self.rows = rows
        self.cache = cache
        self.ram_bytes = ram_bytes
        self.workers = workers
        self.close_wait_s = close_wait_s
        self._decoded: OrderedDict[int, list[sh.EncodedUtterance]] = OrderedDict()
        self._decoded_bytes: dict[int, int] = {}
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()  # ``_pending``, shared with the download threads
        self._pool: ThreadPoolExecutor | None = None
        self._decodes = 0

    @property
    def stats(self) -> dict[str, int]:
        """Shards downloaded, found in the cache, read uncached (the disk nearly full), decoded."""
        return self.cache.stats | {"decoded": self._decodes}

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
        out = {"shards_uncached": float(self.cache.stats["uncached"])}
        fetched = self.cache.fetched
        if fetched[1] > 0:
            out["shard_mb_s"] = fetched[0] / 1e6 / fetched[1]
        try:
            out["cache_free_gb"] = shutil.disk_usage(self.cache.root).free / 1e9
        except OSError:
            pass
        return out

    def close(self) -> None:
        """Cancel the downloads not started; wait for those running at most ``close_wait_s``, then leave them."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            running = [f for f in self._pending.values() if not f.cancelled()]
            _, late = futures_wait(running, timeout=self.close_wait_s)
            if late:
                log.warning("%d shard download(s) of %s still running %.0f s after the reader closed (a stalled "
                            "connection to the bucket?); not waited for", len(late), self.prepared_uri,
                            self.close_wait_s)
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
        self._decodes += 1
        self._decoded[s] = rows
        self._decoded_bytes[s] = sum(r.codes.nbytes + len(r.text) for r in rows)
        while len(self._decoded) > 1 and self.ram_used > self.ram_bytes:
            old, _ = self._decoded.popitem(last=False)
            del self._decoded_bytes[old]
        return rows

    def _fetch(self, s: int) -> bytes:
        """The shard's bytes: a local one read in place, a remote one through the node's cache."""
        uri = sh.shard_uri(self.prepared_uri, self.rows.shards[s])
        if storage.is_local(uri):
            return storage.read_bytes(uri)
        name = self.rows.shards[s]
        local = storage.checked_join(self.cache.root / uri_key(self.prepared_uri), f"{name}.parquet", sh.INDEX_FILE,
                                     single=True)
        return self.cache.read(uri, local, sha256=self.rows.checksums.get(name))


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
