"""Reading prepared shards and planning batches.

The batch plan is a pure function of (seed, epoch) over the prepared index, so the resume cursor
of the data is just ``(epoch, batch index)``: :class:`BatchStream` has ``state_dict()``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from voxrelay import storage
from voxrelay.data import shards as sh
from voxrelay.data.shard_cache import ShardCache
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
        in_use = {storage.checked_join(local, f"{name}.parquet", sh.INDEX_FILE, single=True) for name in shards}
        checksums = sh.checksums(index)
        rows: list[sh.EncodedUtterance] = []
        for name in shards:
            uri = sh.shard_uri(prepared_uri, name)
            if storage.is_local(uri):
                data = storage.read_bytes(uri)
            else:
                data = cache.read(uri, local / f"{name}.parquet", in_use, checksums.get(name))
            rows += sh.decode_table(data, index["num_codebooks"])
        return cls(prepared_uri, index, rows)

    def __len__(self) -> int:
        return len(self.rows)


class BatchPlan:
    """Duration-bucketed batches under a per-batch budget; a pure function of (seed, epoch).

    Rows are sorted by length (random tie-break from the seed and epoch), cut greedily into
    batches whose padded size fits the budget, and the batch order is shuffled. With ``packed`` (batches laid
    end to end in one row, no padding: ``train.packing``) rows are not sorted: they are shuffled and cut
    greedily where their summed length would pass the budget.
    ``lengths`` are token counts (incl. text); ``durations`` are seconds of audio. ``square_budget``: padded
    batches also keep count x longest² under it (a family whose memory grows with the square of its longest example).

    With ``shards`` (each row's shard) and a ``window`` smaller than the number of shards, the
    shuffle is local: the epoch's shard order is shuffled, cut into windows of ``window`` shards, and
    each window's rows are bucketed and shuffled on their own, so a stretch of batches reads only a
    window's shards (what a streaming reader fetches and caches). ``window`` 0, or as many shards as
    there are, is the global plan above.
    """

    def __init__(
        self,
        lengths: list[int] | np.ndarray,
        durations: list[float] | np.ndarray,
        seed: int,
        batch_tokens: int | None = None,
        batch_seconds: float | None = None,
        shards: np.ndarray | None = None,
        window: int = 0,
        packed: bool = False,
        square_budget: int | None = None,
    ):
        self.lengths = np.asarray(lengths, dtype=np.int32)
        self.durations = np.asarray(durations, dtype=np.float64)
        self.seed = seed
        self.batch_tokens = batch_tokens
        self.batch_seconds = batch_seconds
        self.shards = None if shards is None else np.asarray(shards, dtype=np.int32)
        self.window = window
        self.packed = packed
        self.square_budget = square_budget  # padded batches: count x longest^2 at most this (None: no cap)

    def _cuts(self, order: np.ndarray) -> list[int]:
        """Where the greedy cut of ``order`` (rows sorted by length, or shuffled when packed) starts each batch
        after the first."""
        cuts: list[int] = []
        count, seconds, pos, tokens = 0, 0.0, 0, 0
        for start in range(0, len(order), CHUNK):  # a chunk at a time: no Python int per row of a big split
            rows = order[start:start + CHUNK]
            for n, d in zip(self.lengths[rows].tolist(), self.durations[rows].tolist(), strict=True):
                if self.batch_tokens is None:
                    fits = seconds + d <= self.batch_seconds
                else:  # padded: every row as long as this one (the longest so far); packed: their sum
                    fits = (tokens if self.packed else count * n) + n <= self.batch_tokens
                    if fits and self.square_budget is not None and not self.packed:
                        fits = (count + 1) * n * n <= self.square_budget
                if count and not fits:
                    cuts.append(pos)
                    count, seconds, tokens = 0, 0.0, 0
                count += 1
                seconds += d
                tokens += n
                pos += 1
        return cuts

    def _bucketed(self, rows: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` sorted by length (random tie-break; shuffled when packed), cut greedily under the budget,
        batches shuffled: the rows in that order and each batch's (start, end) in it, in the shuffled batch order."""
        if self.packed:
            order = rows[rng.permutation(len(rows))].astype(np.int32)
        else:
            order = rows[np.lexsort((rng.random(len(rows)), self.lengths[rows]))].astype(np.int32)
        bounds = np.asarray([0, *self._cuts(order), len(order)], dtype=np.int64)
        spans = np.stack([bounds[:-1], bounds[1:]], axis=1)
        return order, spans[rng.permutation(len(spans))]

    def batches(self, epoch: int) -> Batches:
        rng = np.random.default_rng([self.seed, epoch])
        count = 0 if self.shards is None or not len(self.shards) else int(self.shards.max()) + 1
        if not self.window or count <= self.window:
            return Batches([self._bucketed(np.arange(len(self.lengths)), rng)])
        by_shard = np.argsort(self.shards, kind="stable").astype(np.int32)
        starts = np.searchsorted(self.shards[by_shard], np.arange(count + 1))
        order = rng.permutation(count)
        parts = []
        for w in range(0, count, self.window):
            rows = np.concatenate([by_shard[starts[s]:starts[s + 1]] for s in order[w:w + self.window]])
            parts.append(self._bucketed(rows, np.random.default_rng([self.seed, epoch, 1 + w // self.window])))
        return Batches(parts)


CHUNK = 65536  # rows per chunk of the greedy cut


class Batches(Sequence):
    """An epoch's batches, compactly: per part (the whole split, or a shuffle window) the rows in plan order
    (int32) and each batch's span in it; ``batches[j]`` is the list of row ids of batch ``j``. About 4 bytes a
    row instead of a Python list of ints (~36)."""

    def __init__(self, parts: list[tuple[np.ndarray, np.ndarray]]):
        self.parts = parts
        self.offsets = np.cumsum([0] + [len(spans) for _, spans in parts])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, j: int) -> list[int]:
        if j < 0:
            j += len(self)
        if not 0 <= j < len(self):
            raise IndexError(j)
        p = int(np.searchsorted(self.offsets, j, side="right")) - 1
        order, spans = self.parts[p]
        start, end = spans[j - self.offsets[p]]
        return order[start:end].tolist()

    def __eq__(self, other) -> bool:
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None


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

    With ``ahead`` > 0 a background thread builds the next ``ahead`` batches (fetching, decoding,
    tokenising, collating, pinning memory on a GPU host) while the loop trains; the cursor still moves
    only when the loop takes a batch, so a checkpoint resumes at the first batch the loop did not train
    on. ``make_batch`` may have ``want(upcoming)``: called with the ids of this rank's next batches
    before each is built (what a streaming reader prefetches).
    """

    def __init__(
        self,
        plan: BatchPlan,
        make_batch: Callable[[list[int]], dict],
        rank: int = 0,
        world: int = 1,
        cursor: Cursor | None = None,
        ahead: int = 0,
    ):
        self.plan = plan
        self.make_batch = make_batch
        self.rank = rank
        self.world = world
        self.cursor = cursor or Cursor()
        self.ahead = ahead
        self._plans: dict[int, Batches] = {}  # epoch -> batches, from the cursor's epoch on
        self._builder: _Builder | None = None

    def state_dict(self) -> dict:
        return {"epoch": self.cursor.epoch, "index": self.cursor.index}

    def load_state_dict(self, state: dict) -> None:
        self.close()  # batches built ahead from the old cursor are dropped
        self.cursor = Cursor(int(state["epoch"]), int(state["index"]))

    def close(self) -> None:
        """Stop building ahead (a later ``next`` starts again from the cursor) and ``make_batch``'s threads."""
        if self._builder is not None:
            self._builder.stop()
            self._builder = None
        close = getattr(self.make_batch, "close", None)
        if close is not None:
            close()

    def io_stats(self) -> dict[str, float]:
        """What ``make_batch`` reports of its reads (a streaming reader: shard MB/s, free cache disk), else {}."""
        stats = getattr(self.make_batch, "io_stats", None)
        return stats() if stats is not None else {}

    def _batches(self, epoch: int) -> Batches:
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

    def _step(self, cursor: Cursor, lookahead: int = 0) -> tuple[list[int], Cursor]:
        """This rank's batch at ``cursor`` and the cursor after the step; with ``lookahead``, the ids of this
        rank's next ``lookahead`` batches go to ``make_batch.want`` first."""
        want = getattr(self.make_batch, "want", None)
        if want is not None and lookahead:
            want([self._batches(p.epoch)[p.index] for p in
                  (self._position(cursor.epoch, cursor.index + self.rank + k * self.world) for k in range(lookahead))])
        mine = self._position(cursor.epoch, cursor.index + self.rank)
        ids = self._batches(mine.epoch)[mine.index]
        after = self._position(cursor.epoch, cursor.index + self.world)
        for old in [e for e in self._plans if e < after.epoch]:
            del self._plans[old]  # plans are pure functions of (seed, epoch): only ahead is reused
        return ids, after

    def __iter__(self) -> Iterator[dict]:
        while True:
            if self.ahead <= 0:
                ids, self.cursor = self._step(self.cursor, lookahead=1)
                yield self.make_batch(ids)
                continue
            if self._builder is None:
                self._builder = _Builder(self, self.cursor)
            after, batch = self._builder.take()
            self.cursor = after
            yield batch


class _Builder:
    """The thread that builds a :class:`BatchStream`'s next batches from ``start`` on (see its docstring)."""

    LOOKAHEAD = 8  # batches whose shards are handed to ``want``
    STOP_WAIT_S = 60.0  # the longest :meth:`stop` waits for the batch in the making

    def __init__(self, stream: BatchStream, start: Cursor):
        self.stream = stream
        self.queue: queue.Queue = queue.Queue(maxsize=stream.ahead)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(start,), name="voxrelay-batches", daemon=True)
        self.thread.start()

    def _run(self, cursor: Cursor) -> None:
        pin = torch.cuda.is_available()
        try:
            while not self.stopping.is_set():
                ids, cursor = self.stream._step(cursor, self.LOOKAHEAD)
                batch = self.stream.make_batch(ids)
                if pin:
                    batch = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                self._put((cursor, batch))
        except BaseException as err:  # noqa: BLE001 - handed to the training thread, which raises it
            self._put((None, err))

    def _put(self, item: tuple) -> None:
        while not self.stopping.is_set():
            try:
                self.queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def take(self) -> tuple[Cursor, dict]:
        after, batch = self.queue.get()
        if after is None:
            self.stream._builder = None
            raise batch
        return after, batch

    def stop(self) -> None:
        """Stop building; wait for the batch in the making at most :attr:`STOP_WAIT_S` (a read stalled on the
        bucket is abandoned: the thread is a daemon, its batch is dropped)."""
        self.stopping.set()
        self.thread.join(self.STOP_WAIT_S)
        if self.thread.is_alive():
            log.warning("the thread building batches ahead did not stop within %.0f s (a shard read stalled on "
                        "the bucket?); it is left behind, its batch unused", self.STOP_WAIT_S)
