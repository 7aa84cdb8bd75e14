"""Reading prepared shards and planning batches.

The batch plan is a pure function of (seed, epoch) over the prepared index, so the resume cursor
of the data is just ``(epoch, batch index)``: :class:`BatchStream` has ``state_dict()``.
"""

from __future__ import annotations

import logging
import os
import stat
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voxrelay import storage
from voxrelay.data import shards as sh
from voxrelay.paths import cache_dir, uri_key

log = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 20 * 2**30  # the default of cache.max_gb


class PreparedDataset:
    """The rows of one split of prepared data, held in memory (codes int16 [K, T] per row)."""

    def __init__(self, prepared_uri: str, index: dict, rows: list[sh.EncodedUtterance]):
        self.prepared_uri = prepared_uri
        self.index = index
        self.rows = rows

    @classmethod
    def open(cls, prepared_uri: str, split: str, index: dict | None = None,
             max_bytes: int = DEFAULT_CACHE_BYTES) -> PreparedDataset:
        """Load a split (``index``: the already read index.json, if any).

        Remote shards are cached in ``$VOXRELAY_CACHE/prepared/<key>/`` (reused when the size
        matches); the whole prepared cache stays under ``max_bytes`` (``cache.max_gb``) by evicting
        the least recently used shards, never one of this split.
        """
        index = index or sh.load_index(prepared_uri)
        shards = [s["name"] for s in index["shards"] if s["split"] == split]
        cache = ShardCache(cache_dir("prepared"), max_bytes)
        local = cache.root / uri_key(prepared_uri)
        in_use = {local / f"{name}.parquet" for name in shards}
        rows: list[sh.EncodedUtterance] = []
        for name in shards:
            uri = sh.shard_uri(prepared_uri, name)
            if storage.is_local(uri):
                data = storage.read_bytes(uri)
            else:
                data = cache.read(uri, local / f"{name}.parquet", in_use)
            rows += sh.decode_table(data, index["num_codebooks"])
        return cls(prepared_uri, index, rows)

    def __len__(self) -> int:
        return len(self.rows)


class ShardCache:
    """Local copies of remote shards under ``root`` (all prepared datasets), at most ``max_bytes``.

    A use touches the file's times; room is made by deleting the least recently used files. The
    files of the split being opened are never evicted (a split larger than the cap is still loaded,
    with a warning). The folder is scanned once per instance (one ``open()``), not per shard.
    Another process may evict a file between our check and our read: then it is downloaded again.
    """

    def __init__(self, root: Path, max_bytes: int):
        self.root = root
        self.max_bytes = max_bytes
        self._lru: OrderedDict[Path, int] | None = None  # path -> bytes, least recently used first
        self._bytes = 0
        self._warned = False

    def read(self, uri: str, path: Path, in_use: set[Path]) -> bytes:
        size = storage.size(uri)
        try:
            if path.stat().st_size == size:
                os.utime(path)  # the LRU clock, for later open() calls: mtime = last use
                data = path.read_bytes()
                self._touched(path, size)
                return data
        except FileNotFoundError:
            pass  # not cached, or evicted by another process just now
        self.make_room(size, in_use)
        storage.get_file(uri, path)
        self._touched(path, size)
        try:
            return path.read_bytes()
        except FileNotFoundError:  # evicted by another process at once: read it from storage
            return storage.read_bytes(uri)

    def _entries(self) -> OrderedDict[Path, int]:
        if self._lru is None:
            found = []
            for path in self.root.rglob("*"):
                if ".part-" in path.name:
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

    def make_room(self, incoming: int, in_use: set[Path]) -> None:
        """Delete least recently used files until ``incoming`` more bytes fit under the cap."""
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


class BatchPlan:
    """Duration-bucketed batches under a per-batch budget; a pure function of (seed, epoch).

    Rows are sorted by length (random tie-break from the seed and epoch), cut greedily into
    batches whose padded size fits the budget, and the batch order is shuffled.
    ``lengths`` are token counts (incl. text); ``durations`` are seconds of audio.
    """

    def __init__(
        self,
        lengths: list[int],
        durations: list[float],
        seed: int,
        batch_tokens: int | None = None,
        batch_seconds: float | None = None,
    ):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.durations = np.asarray(durations, dtype=np.float64)
        self.seed = seed
        self.batch_tokens = batch_tokens
        self.batch_seconds = batch_seconds

    def _fits(self, count: int, max_len: int, seconds: float) -> bool:
        if self.batch_tokens is not None:
            return count * max_len <= self.batch_tokens
        return seconds <= self.batch_seconds

    def batches(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, epoch])
        order = np.lexsort((rng.random(len(self.lengths)), self.lengths))
        out: list[list[int]] = []
        cur: list[int] = []
        seconds = 0.0
        for i in order.tolist():
            if cur and not self._fits(len(cur) + 1, int(self.lengths[i]), seconds + self.durations[i]):
                out.append(cur)
                cur, seconds = [], 0.0
            cur.append(i)
            seconds += float(self.durations[i])
        if cur:
            out.append(cur)
        return [out[j] for j in rng.permutation(len(out))]


@dataclass
class Cursor:
    epoch: int = 0
    index: int = 0  # next global batch of the epoch's plan


class BatchStream:
    """Endless iterator of collated batches for one process of ``world``.

    Cursor arithmetic: the plans of epochs 0, 1, 2, ... are read as ONE endless global sequence
    of batches, and the cursor ``(epoch, index)`` is a position in it (``index`` <
    ``len(plan.batches(epoch))``). At each step rank ``r`` takes the batch at position
    ``cursor + r`` (which may lie in the next epoch, or further when an epoch has fewer batches
    than processes), then the cursor advances by ``world``. Every rank keeps the same cursor, so
    a checkpoint made with W processes resumes with any other count at the same global position:
    nothing is skipped or repeated, and one process consumes exactly the global order.
    """

    def __init__(
        self,
        plan: BatchPlan,
        make_batch: Callable[[list[int]], dict],
        rank: int = 0,
        world: int = 1,
        cursor: Cursor | None = None,
    ):
        self.plan = plan
        self.make_batch = make_batch
        self.rank = rank
        self.world = world
        self.cursor = cursor or Cursor()
        self._plans: dict[int, list[list[int]]] = {}  # epoch -> batches, from the cursor's epoch on

    def state_dict(self) -> dict:
        return {"epoch": self.cursor.epoch, "index": self.cursor.index}

    def load_state_dict(self, state: dict) -> None:
        self.cursor = Cursor(int(state["epoch"]), int(state["index"]))

    def _batches(self, epoch: int) -> list[list[int]]:
        if epoch not in self._plans:
            batches = self.plan.batches(epoch)
            if not batches:
                raise ValueError("the batch plan is empty: there are no training rows; prepare data first")
            self._plans[epoch] = batches
        return self._plans[epoch]

    def _position(self, epoch: int, index: int) -> Cursor:
        """The global position ``index`` batches after the start of ``epoch``, as (epoch, index)."""
        while index >= len(self._batches(epoch)):
            index -= len(self._batches(epoch))
            epoch += 1
        return Cursor(epoch, index)

    def __iter__(self) -> Iterator[dict]:
        while True:
            mine = self._position(self.cursor.epoch, self.cursor.index + self.rank)
            ids = self._batches(mine.epoch)[mine.index]
            self.cursor = self._position(self.cursor.epoch, self.cursor.index + self.world)
            for old in [e for e in self._plans if e < self.cursor.epoch]:
                del self._plans[old]  # plans are pure functions of (seed, epoch): only ahead is reused
            yield self.make_batch(ids)
