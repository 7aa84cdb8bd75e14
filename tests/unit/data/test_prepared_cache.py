"""The local cache of remote prepared shards: reused, bounded by ``max_bytes``, least recently
used evicted, never a shard of the split being opened."""

import logging
import os
import time

import pytest

from tests.helpers.prepared import synthetic
from voxrelay import storage
from voxrelay.data.loader import PreparedDataset
from voxrelay.paths import uri_key

K = 2


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "prepared"


def _prepared(uri: str, seed: int, shards: int = 2, rows: int = 3) -> int:
    """Prepared data with ``shards`` train shards and one eval shard of random (incompressible)
    codes; returns the size of a train shard in bytes."""
    made = synthetic(uri, train=shards, eval=1, rows=rows, codebooks=K, seed=seed)
    return max(size for name, size in made.sizes.items() if name.startswith("train"))


def _cached(cache, uri: str) -> list[str]:
    folder = cache / uri_key(uri)
    return sorted(p.name for p in folder.glob("*.parquet")) if folder.exists() else []


def _age(cache, uri: str, seconds: float) -> None:
    """Make the cached files of ``uri`` look last used ``seconds`` ago (instead of sleeping)."""
    t = time.time() - seconds
    for path in (cache / uri_key(uri)).glob("*.parquet"):
        os.utime(path, (t, t))


def _ids(uri: str, split: str = "train", **kw) -> list[str]:
    return [r.id for r in PreparedDataset.open(uri, split, **kw).rows]


def test_least_recently_used_dataset_is_evicted_to_stay_under_the_cap(memory_root, cache):
    a, b, c = (storage.join(memory_root, "prepared", x) for x in "abc")
    size = max(_prepared(a, 1), _prepared(b, 2), _prepared(c, 3))
    cap = 4 * size + size // 2  # room for two train splits of 2 shards, not three
    first_a, first_b = _ids(a, max_bytes=cap), _ids(b, max_bytes=cap)
    assert _cached(cache, a) == _cached(cache, b) == ["train-00000.parquet", "train-00001.parquet"]
    _age(cache, a, 100)
    _age(cache, b, 50)
    assert _ids(a, max_bytes=cap) == first_a  # reused: this use makes a the most recently used
    assert _ids(c, max_bytes=cap) == [f"3-{n}-{i}" for n in range(2) for i in range(3)]
    assert _cached(cache, b) == [] and len(_cached(cache, a)) == len(_cached(cache, c)) == 2
    used = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
    assert used <= cap
    assert _ids(b, max_bytes=cap) == first_b  # evicted data is simply downloaded again


def test_a_split_larger_than_the_cap_is_loaded_whole_with_a_warning(memory_root, cache, caplog):
    a, b = storage.join(memory_root, "a"), storage.join(memory_root, "b")
    size = max(_prepared(a, 1, shards=3), _prepared(b, 2))
    _ids(b, max_bytes=10 * size)
    with caplog.at_level(logging.WARNING):
        ids = _ids(a, max_bytes=size)  # one shard fits; the split has three
    assert ids == [f"1-{n}-{i}" for n in range(3) for i in range(3)]
    assert len(_cached(cache, a)) == 3  # none of the split's own shards was evicted
    assert _cached(cache, b) == []  # everything else was
    assert "cache.max_gb" in caplog.text and "loaded anyway" in caplog.text


def test_a_stale_cached_shard_is_downloaded_again(memory_root, cache):
    a = storage.join(memory_root, "a")
    _prepared(a, 1)
    first = _ids(a)
    (cache / uri_key(a) / "train-00000.parquet").write_bytes(b"cut short")
    assert _ids(a) == first
    assert _ids(a, "eval") == ["1-2-0", "1-2-1", "1-2-2"]
