"""The row index: per-row facts of a split in a compact sidecar, so a batch plan needs no codes.

``prepare`` writes ``rows-<split>.parquet`` beside the shards (before ``index.json``, which names it):
one row per utterance with its shard (position in the split's shard list), its row in that shard,
``num_frames``, ``duration``, ``text_chars`` and ``speaker`` (dictionary-encoded). About 20 bytes a row:
2.4 M rows (10k hours of 15 s clips) is ~50 MB in memory and a few MB on disk.

A family's example length depends on its tokenizer, so :func:`plan_lengths` computes the lengths once
per (prepared data, model config) from the shards' text columns only (Parquet column projection: no
codes are read) and caches them in the bucket under ``lengths/``; later sessions read ~4 bytes a row.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from voxrelay import storage
from voxrelay.data import shards as sh
from voxrelay.models.base import num_frames

log = logging.getLogger(__name__)

META_COLUMNS = ["id", "text", "speaker", "description", "duration", "num_frames"]
LENGTHS_DIR = "lengths"
READ_THREADS = 8  # shards whose text columns are read at once when lengths are computed


def rows_file(split: str) -> str:
    return f"rows-{split}.parquet"


@dataclass
class RowMeta:
    """A prepared row without its codes: what a family's ``length`` reads."""

    id: str
    text: str
    speaker: str | None
    description: str | None
    duration: float
    num_frames: int


def row_meta(rows: list) -> dict[str, list]:
    """The sidecar columns of a shard's rows (encoded ones, stored in its ``.done`` marker, or :class:`RowMeta`)."""
    return {"num_frames": [num_frames(r) for r in rows], "duration": [float(r.duration) for r in rows],
            "text_chars": [len(r.text) for r in rows], "speaker": [r.speaker for r in rows]}


def shard_meta(data_or_file) -> Iterator[RowMeta]:
    """The rows of a shard without their codes (only the metadata columns are read)."""
    table = pq.read_table(data_or_file, columns=META_COLUMNS).to_pydict()
    for i in range(len(table["id"])):
        yield RowMeta(table["id"][i], table["text"][i], table["speaker"][i], table["description"][i],
                      float(table["duration"][i]), int(table["num_frames"][i]))


def _open_shard(prepared_uri: str, name: str):
    """A seekable handle on a shard: a remote one is read by ranges (only the columns asked for)."""
    uri = sh.shard_uri(prepared_uri, name)
    if storage.is_local(uri):
        return storage.local_path(uri)
    return io.BytesIO(storage.read_bytes(uri)) if storage.size(uri) < 8 * 2**20 else storage.open_read(uri)


def write_row_index(prepared_uri: str, split: str, shard_metas: list[dict[str, list]]) -> str:
    """Write the split's sidecar from each of its shards' :func:`row_meta` (in shard order); its file name."""
    buf = io.BytesIO()
    pq.write_table(meta_table(shard_metas), buf, compression="zstd")
    uri = storage.join(prepared_uri, rows_file(split))
    if not storage.exists(uri) or storage.read_bytes(uri) != buf.getvalue():  # an unchanged prepare rewrites nothing
        storage.write_bytes(uri, buf.getvalue())
    return rows_file(split)


def meta_table(shard_metas: list[dict[str, list]]) -> pa.Table:
    """The sidecar table of a split from each of its shards' :func:`row_meta` (in shard order)."""
    cols: dict[str, list] = {"shard": [], "row": [], "num_frames": [], "duration": [], "text_chars": [],
                             "speaker": []}
    for s, meta in enumerate(shard_metas):
        n = len(meta["num_frames"])
        cols["shard"] += [s] * n
        cols["row"] += list(range(n))
        for key in ("num_frames", "duration", "text_chars", "speaker"):
            cols[key] += meta[key]
    return pa.table({
        "shard": pa.array(cols["shard"], pa.int32()), "row": pa.array(cols["row"], pa.int32()),
        "num_frames": pa.array(cols["num_frames"], pa.int32()), "duration": pa.array(cols["duration"], pa.float32()),
        "text_chars": pa.array(cols["text_chars"], pa.int32()),
        "speaker": pa.array(cols["speaker"], pa.string()).dictionary_encode(),
    })


def meta_of_shard(prepared_uri: str, name: str) -> dict[str, list]:
    """:func:`row_meta` of a committed shard, read from its metadata columns (data prepared before the sidecar)."""
    return row_meta(list(shard_meta(_open_shard(prepared_uri, name))))


@dataclass
class RowIndex:
    """Per-row facts of one split (numpy columns, one entry per row, in shard order)."""

    shards: list[str]  # the split's shard names, in the index's order
    shard: np.ndarray  # int32: position in ``shards``
    row: np.ndarray  # int32: row in its shard
    num_frames: np.ndarray  # int32
    duration: np.ndarray  # float32, seconds
    text_chars: np.ndarray  # int32
    speaker: np.ndarray  # int32: position in ``speakers``, -1 for none
    speakers: list[str]
    checksums: dict[str, str] = field(default_factory=dict)  # shard name -> sha256 (prepared data that has them)

    def __len__(self) -> int:
        return len(self.row)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.shard, self.row, self.num_frames, self.duration, self.text_chars,
                                      self.speaker))

    @classmethod
    def load(cls, prepared_uri: str, index: dict, split: str) -> RowIndex:
        """The split's sidecar; data prepared before sidecars existed gets one built from its shards'
        metadata columns (once per session: `voxrelay prepare` again writes it)."""
        shards = [s["name"] for s in index["shards"] if s["split"] == split]
        name = index.get("row_index", {}).get(split)
        if name is None:
            log.info("the prepared data at %s has no row index (prepared by an older voxrelay); reading its "
                     "shards' metadata columns instead (run `voxrelay prepare` again to write one)", prepared_uri)
            out = cls.from_table(shards, meta_table([meta_of_shard(prepared_uri, s) for s in shards]))
        else:
            out = cls.from_table(shards, pq.read_table(io.BytesIO(storage.read_bytes(storage.join(prepared_uri,
                                                                                                    name)))))
        out.checksums = sh.checksums(index)
        return out

    @classmethod
    def from_table(cls, shards: list[str], table: pa.Table) -> RowIndex:
        spk = table.column("speaker").combine_chunks()
        if not isinstance(spk.type, pa.DictionaryType):
            spk = spk.dictionary_encode()
        codes = spk.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)
        col = lambda name, dtype: table.column(name).to_numpy().astype(dtype)  # noqa: E731
        return cls(shards, col("shard", np.int32), col("row", np.int32), col("num_frames", np.int32),
                   col("duration", np.float32), col("text_chars", np.int32), codes, spk.dictionary.to_pylist())


def lengths_key(model_config: dict, index: dict, split: str) -> str:
    """What a split's example lengths depend on: the model config and the prepared rows."""
    blob = json.dumps([model_config, index.get("identity"), index.get("created"), split], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def plan_lengths(length: Callable[[RowMeta], int], key: str, prepared_uri: str, rows: RowIndex) -> np.ndarray:
    """Every row's example length (int32, row-index order), from ``lengths/<key>.npy`` when an earlier session
    computed it, else from the shards' text columns (then written there for the next session). A job of several
    processes shares the work instead: :func:`cached_lengths`, :func:`shard_lengths` on each, :func:`store_lengths`."""
    cached = cached_lengths(key, prepared_uri, len(rows))
    if cached is not None:
        return cached
    out = np.concatenate(shard_lengths(length, prepared_uri, rows, range(len(rows.shards)))).astype(np.int32)
    store_lengths(key, prepared_uri, out)
    return out


def _lengths_uri(prepared_uri: str, key: str) -> str:
    return storage.join(prepared_uri, LENGTHS_DIR, f"{key}.npy")


def cached_lengths(key: str, prepared_uri: str, count: int) -> np.ndarray | None:
    """The lengths an earlier session computed for ``key`` (None when there are none, or not ``count`` of them)."""
    uri = _lengths_uri(prepared_uri, key)
    if storage.exists(uri):
        cached = np.load(io.BytesIO(storage.read_bytes(uri)), allow_pickle=False)
        if cached.shape == (count,):
            return cached
    return None


def shard_lengths(length: Callable[[RowMeta], int], prepared_uri: str, rows: RowIndex,
                  shards: range) -> list[np.ndarray]:
    """The example lengths of the rows of ``shards`` (positions in the split's shard list), one array a shard in
    row order, from the shards' text columns (a few shards read at once)."""
    out = []
    with ThreadPoolExecutor(READ_THREADS) as pool:  # remote column reads overlap; lengths on this thread
        for first in range(0, len(shards), 4 * READ_THREADS):  # a few shards' text in memory at a time
            names = [rows.shards[s] for s in shards[first:first + 4 * READ_THREADS]]
            metas = pool.map(lambda name: list(shard_meta(_open_shard(prepared_uri, name))), names)
            out += [np.fromiter((length(m) for m in shard), dtype=np.int32, count=len(shard)) for shard in metas]
    return out


def store_lengths(key: str, prepared_uri: str, lengths: np.ndarray) -> None:
    """Cache ``lengths`` in the bucket for the next sessions; a bucket that refuses only costs computing them again."""
    uri = _lengths_uri(prepared_uri, key)
    buf = io.BytesIO()
    np.save(buf, lengths, allow_pickle=False)
    try:
        storage.write_bytes(uri, buf.getvalue())
        log.info("example lengths of %d rows computed from their text and cached at %s", len(lengths), uri)
    except (storage.StorageError, OSError) as err:  # e.g. prepared data in a bucket this account may only read
        log.warning("the example lengths could not be cached at %s (%s): the next session computes them again",
                    uri, str(err).split("\n")[0][:200])
