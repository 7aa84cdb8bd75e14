"""Reading prepared shards and planning batches.

The batch plan is a pure function of (seed, epoch) over the prepared index, so the resume cursor
of the data is just ``(epoch, batch index)``: :class:`BatchStream` has ``state_dict()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from voxrelay import storage
from voxrelay.data import shards as sh
from voxrelay.paths import cache_dir, uri_key

log = logging.getLogger(__name__)


class PreparedDataset:
    """The rows of one split of prepared data, held in memory (codes int16 [K, T] per row)."""

    def __init__(self, prepared_uri: str, index: dict, rows: list[sh.EncodedUtterance]):
        self.prepared_uri = prepared_uri
        self.index = index
        self.rows = rows

    @classmethod
    def open(cls, prepared_uri: str, split: str, index: dict | None = None) -> PreparedDataset:
        """Load a split (``index``: the already read index.json, if any); remote shards are cached
        locally (reused when the size matches)."""
        index = index or sh.load_index(prepared_uri)
        local = cache_dir("prepared", uri_key(prepared_uri))
        rows: list[sh.EncodedUtterance] = []
        for shard in index["shards"]:
            if shard["split"] != split:
                continue
            uri = sh.shard_uri(prepared_uri, shard["name"])
            if storage.is_local(uri):
                data = storage.read_bytes(uri)
            else:
                path = local / f"{shard['name']}.parquet"
                if not path.exists() or path.stat().st_size != storage.size(uri):
                    storage.get_file(uri, path)
                data = path.read_bytes()
            rows += sh.decode_table(data, index["num_codebooks"])
        return cls(prepared_uri, index, rows)

    def __len__(self) -> int:
        return len(self.rows)


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
    """Endless iterator of collated batches for one process.

    Global batch ``i`` of an epoch goes to rank ``i % world``; each epoch's plan is cut to a
    multiple of ``world`` so every rank makes the same number of steps.
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

    def state_dict(self) -> dict:
        return {"epoch": self.cursor.epoch, "index": self.cursor.index}

    def load_state_dict(self, state: dict) -> None:
        self.cursor = Cursor(int(state["epoch"]), int(state["index"]))

    def __iter__(self) -> Iterator[dict]:
        while True:
            batches = self.plan.batches(self.cursor.epoch)
            usable = len(batches) - len(batches) % self.world
            if usable == 0:
                raise ValueError(
                    f"the batch plan has {len(batches)} batches for {self.world} processes; "
                    "lower train.batch_tokens/batch_seconds or prepare more data"
                )
            while self.cursor.index < usable:
                ids = batches[self.cursor.index + self.rank]
                self.cursor.index += self.world
                yield self.make_batch(ids)
            self.cursor = Cursor(self.cursor.epoch + 1, 0)
