"""Streaming prepared data: the row index (a plan without codes), cached example lengths, shuffle windows,
the shard source's bounded RAM and disk and its prefetch, and batches built ahead on a thread."""

import threading

import numpy as np
import pytest

from tests.helpers.prepared import synthetic
from voxrelay import storage
from voxrelay.data import rowindex as ri
from voxrelay.data import shards as sh
from voxrelay.data.loader import BatchPlan, BatchStream
from voxrelay.data.shard_cache import ShardCache
from voxrelay.data.stream import ShardSource, StreamBatches
from voxrelay.paths import uri_key

K = 2


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "prepared"


def _prepared(uri: str, shards: int = 6, rows: int = 5, sidecar: bool = True) -> dict:
    """A train split of ``shards`` shards of random codes of varied length and speaker; its index."""
    return synthetic(uri, train=shards, rows=rows, codebooks=K, seed=7, varied=True, row_index=sidecar).index


def _rows(uri: str, index: dict) -> list:
    """Every train row, read straight from the shards (not through a cache the test looks at)."""
    return [r for s in index["shards"] for r in sh.decode_table(storage.read_bytes(sh.shard_uri(uri, s["name"])), K)]


def _length(row) -> int:
    return len(row.text.split()) + 1 + int(getattr(row, "num_frames", 0) or row.codes.shape[1])


def test_the_row_index_holds_every_rows_facts_and_older_data_gets_one_from_its_shards(memory_root):
    index = _prepared(memory_root)
    rows = _rows(memory_root, index)
    for idx in (ri.RowIndex.load(memory_root, index, "train"),
                ri.RowIndex.load(memory_root, {k: v for k, v in index.items() if k != "row_index"}, "train")):
        assert len(idx) == len(rows) == 30
        assert idx.num_frames.tolist() == [r.codes.shape[1] for r in rows]
        assert np.allclose(idx.duration, [r.duration for r in rows])
        assert idx.text_chars.tolist() == [len(r.text) for r in rows]
        assert [None if s < 0 else idx.speakers[s] for s in idx.speaker] == [r.speaker for r in rows]
        assert [f"s{s}-r{r}" for s, r in zip(idx.shard, idx.row, strict=True)] == [r.id for r in rows]
        assert idx.nbytes <= 24 * len(idx)


def test_lengths_are_computed_from_the_text_columns_once_then_read_from_the_bucket(memory_root):
    index = _prepared(memory_root)
    rows = _rows(memory_root, index)
    idx = ri.RowIndex.load(memory_root, index, "train")
    seen = []

    def length(meta):
        assert not hasattr(meta, "codes")  # no codes were read
        seen.append(meta.id)
        return _length(meta)

    first = ri.plan_lengths(length, "k1", memory_root, idx)
    assert first.tolist() == [_length(r) for r in rows] and len(seen) == 30
    again = ri.plan_lengths(lambda meta: pytest.fail("recomputed"), "k1", memory_root, idx)
    assert again.tolist() == first.tolist()
    assert storage.exists(storage.join(memory_root, "lengths", "k1.npy"))
    assert ri.lengths_key({"a": 1}, index, "train") != ri.lengths_key({"a": 2}, index, "train")


def test_a_shuffle_window_reads_only_its_shards_and_covers_every_row_once():
    rng = np.random.default_rng(0)
    shards = np.repeat(np.arange(40), 25)
    lengths = rng.integers(50, 600, len(shards))
    plan = BatchPlan(lengths, lengths / 60.0, 3, batch_tokens=2000, shards=shards, window=8)
    batches = plan.batches(0)
    assert sorted(i for b in batches for i in b) == list(range(len(shards)))
    assert batches == plan.batches(0) and batches != plan.batches(1)
    # walk the batches: the shards read so far in a window never exceed 8, then the next window starts
    windows, current = [], set()
    for b in batches:
        mine = set(shards[b].tolist())
        if len(current | mine) > 8:
            windows.append(current)
            current = set()
        current |= mine
    windows.append(current)
    assert len(windows) == 5 and all(len(w) == 8 for w in windows)
    assert set().union(*windows) == set(range(40))
    # a window as large as the split, or none: the global plan, batch for batch
    plain = BatchPlan(lengths, lengths / 60.0, 3, batch_tokens=2000)
    assert BatchPlan(lengths, lengths / 60.0, 3, batch_tokens=2000, shards=shards, window=40).batches(0) \
        == plain.batches(0)
    assert max(len(set(shards[b].tolist())) for b in plain.batches(0)) > 8  # global batches mix many shards


def _source(uri: str, index: dict, ram_bytes: int = 2**30, min_free: int = 0, max_bytes: int = 2**30):
    idx = ri.RowIndex.load(uri, index, "train")
    return ShardSource(uri, K, idx, ShardCache(storage_cache(), max_bytes, min_free), ram_bytes), idx


def storage_cache():
    from voxrelay.paths import cache_dir

    return cache_dir("prepared")


def test_the_source_serves_rows_within_its_ram_and_disk_caps_and_prefetches_in_order(memory_root, cache):
    index = _prepared(memory_root)
    rows = _rows(memory_root, index)
    cap = int(2.5 * max(storage.size(sh.shard_uri(memory_root, f"train-{n:05d}")) for n in range(6)))
    source, idx = _source(memory_root, index, ram_bytes=1, max_bytes=cap)
    source.want([4, 1])  # the plan's next shards: downloaded in the background
    source._pending[4].result()
    assert (cache / uri_key(memory_root) / "train-00004.parquet").exists()
    order = [29, 3, 12, 27, 0, 5]
    got = source.get(order)
    assert [r.id for r in got] == [rows[i].id for i in order]
    assert all(np.array_equal(g.codes, rows[i].codes) for g, i in zip(got, order, strict=True))
    assert len(source._decoded) == 1  # ram_bytes=1: one decoded shard at a time
    on_disk = sum(p.stat().st_size for p in (cache / uri_key(memory_root)).glob("*.parquet"))
    assert 0 < on_disk <= cap  # cache.max_gb held: least recently used evicted
    assert source.stats["downloaded"] >= 5
    source.close()


def test_prefetch_never_fills_the_disk_the_shards_are_read_into_memory_instead(memory_root, cache):
    index = _prepared(memory_root)
    rows = _rows(memory_root, index)
    source, _ = _source(memory_root, index, min_free=2**62)  # "the disk is nearly full"
    source.want([0, 1, 2])
    got = source.get(range(30))
    assert [r.id for r in got] == [r.id for r in rows]
    assert not list((cache / uri_key(memory_root)).glob("*.parquet")) if (cache / uri_key(memory_root)).exists() \
        else True
    assert source.stats["uncached"] == 6 and source.stats["downloaded"] == 0
    source.close()


def test_batches_built_ahead_on_a_thread_are_those_built_inline_and_the_cursor_is_what_the_loop_took(
        memory_root, cache):
    index = _prepared(memory_root)
    source, idx = _source(memory_root, index)
    keep = np.arange(len(idx))
    plan = BatchPlan(idx.num_frames, idx.duration, 1, batch_tokens=600, shards=idx.shard, window=2)

    def make(src):
        return StreamBatches(src, keep, lambda r: r.id, lambda ex: {"ids": ex}, prefetch=3)

    inline = iter(BatchStream(plan, make(source)))
    straight = [next(inline)["ids"] for _ in range(25)]  # crosses an epoch
    threads = set(threading.enumerate())  # (another test's stream may have left a builder of its own)
    ahead = BatchStream(plan, make(_source(memory_root, index)[0]), ahead=3)
    it = iter(ahead)
    head = [next(it)["ids"] for _ in range(9)]
    assert "voxrelay-batches" in {t.name for t in set(threading.enumerate()) - threads}
    state = ahead.state_dict()  # the builder is ahead of the loop; the cursor is not
    ahead.close()
    resumed = BatchStream(plan, make(_source(memory_root, index)[0]), ahead=2)
    resumed.load_state_dict(state)
    it = iter(resumed)
    tail = [next(it)["ids"] for _ in range(16)]
    resumed.close()
    assert head + tail == straight
    assert "voxrelay-batches" not in {t.name for t in set(threading.enumerate()) - threads}


def test_an_error_building_a_batch_ahead_reaches_the_training_thread():
    plan = BatchPlan([10] * 8, [1.0] * 8, 0, batch_tokens=20)

    def bad(ids):
        raise ValueError("row r3: bad codes")

    with pytest.raises(ValueError, match="row r3"):
        next(iter(BatchStream(plan, bad, ahead=2)))


def test_the_reader_reports_its_download_rate_and_the_free_disk_of_its_cache(memory_root, cache):
    index = _prepared(memory_root)
    source, _ = _source(memory_root, index)
    batches = StreamBatches(source, np.arange(30), lambda r: r.id, lambda ex: {"ids": ex}, prefetch=2)
    stream = BatchStream(BatchPlan([10] * 30, [1.0] * 30, 0, batch_tokens=40), batches)
    assert "shard_mb_s" not in stream.io_stats()  # nothing downloaded yet
    next(iter(stream))
    stats = stream.io_stats()
    assert stats["shard_mb_s"] > 0 and stats["shards_uncached"] == 0
    assert 0 < stats["cache_free_gb"] < 1e6
    assert BatchStream(BatchPlan([10], [1.0], 0, batch_tokens=40), lambda ids: ids).io_stats() == {}
    stream.close()


def test_lengths_are_still_given_when_the_prepared_data_cannot_be_written(tmp_path, caplog):
    uri = str(tmp_path / "prepared")
    index = _prepared(uri)
    idx = ri.RowIndex.load(uri, index, "train")
    (tmp_path / "prepared" / "lengths").write_text("not a folder")  # the cache cannot be written there
    got = ri.plan_lengths(_length, "k", uri, idx)
    assert got.tolist() == [_length(r) for r in _rows(uri, index)]
    assert "could not be cached" in caplog.text
