"""The node's shard cache under pressure (issue 33 H3, C1-C3, H4): a full disk mid-download reads the shard into
memory (one warning), downloads in flight count against ``cache.min_free_gb``, one download per shard per node,
files left by a process killed mid-download are removed and counted, hits are checked against the shard's
sha256 from index.json, and the reader's waits are bounded. Races are forced with Events, not sleeps."""

from __future__ import annotations

import errno
import hashlib
import logging
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.helpers.runner import can_hide_folders
from voxrelay import storage
from voxrelay.data import rowindex as ri
from voxrelay.data import shards as sh
from voxrelay.data.loader import BatchPlan, BatchStream, _Builder
from voxrelay.data.shard_cache import ShardCache
from voxrelay.data.stream import ShardSource
from voxrelay.paths import uri_key

K = 2
BOUND = 20.0  # how long a test waits for an Event before it calls the code under test hung (never when it works)


def _shards(uri: str, count: int = 3, sha: bool = False) -> dict:
    """``count`` train shards of random (incompressible) codes at ``uri``; their index (``sha``: with sha256)."""
    rng = np.random.default_rng(3)
    index = {"num_codebooks": K, "shards": []}
    for n in range(count):
        data = sh.encode_table([sh.EncodedUtterance(f"{n}-{i}", "text", None, None, 1.0,
                                                    rng.integers(0, 1000, (K, 400), dtype=np.int16)) for i in range(3)])
        storage.write_bytes(sh.shard_uri(uri, f"train-{n:05d}"), data)
        index["shards"].append({"name": f"train-{n:05d}", "split": "train"}
                               | ({"sha256": hashlib.sha256(data).hexdigest()} if sha else {}))
    storage.write_json(storage.join(uri, sh.INDEX_FILE), index)
    return index


def _read(cache: ShardCache, uri: str, n: int) -> bytes:
    return cache.read(sh.shard_uri(uri, f"train-{n:05d}"), cache.root / uri_key(uri) / f"train-{n:05d}.parquet")


def _left(root: Path) -> list[str]:
    """Download leftovers under the cache: ``.part-*`` files and in-flight markers."""
    return sorted(p.name for p in root.rglob("*") if ".part-" in p.name or p.name.endswith(".reserved"))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


class _Gate:
    """``storage.get_file`` that blocks the first download of ``uri`` until :meth:`open` (a forced interleaving)."""

    def __init__(self, monkeypatch, uri: str):
        self.uri, self.calls = uri, []
        self.entered, self.released, self.other = threading.Event(), threading.Event(), threading.Event()
        real = storage.get_file

        def get_file(src, local):
            self.calls.append(src)
            if src == self.uri and len([c for c in self.calls if c == self.uri]) == 1:
                self.entered.set()
                assert self.released.wait(BOUND), "the test never released the first download"
            elif src == self.uri:
                self.other.set()  # a second download of the same shard: what C2 forbids
            real(src, local)

        monkeypatch.setattr(storage, "get_file", get_file)


def test_a_disk_that_fills_mid_download_reads_the_shard_into_memory_with_one_warning(memory_root, tmp_path,
                                                                                      monkeypatch, caplog):
    _shards(memory_root)
    cache = ShardCache(tmp_path / "prepared", 2**30)

    def full_disk(src, local):  # the cache's write seam: some bytes land, then the disk is full
        Path(local).write_bytes(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device", str(local))

    monkeypatch.setattr(storage, "get_file", full_disk)
    with caplog.at_level(logging.WARNING, logger="voxrelay.data.shard_cache"):
        got = [_read(cache, memory_root, n) for n in range(3)]
    assert got == [storage.read_bytes(sh.shard_uri(memory_root, f"train-{n:05d}")) for n in range(3)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "No space left on device" in warnings[0], warnings
    assert cache.stats["uncached"] == 3
    assert not list((tmp_path / "prepared").rglob("*.parquet")) and _left(tmp_path / "prepared") == []


def test_downloads_in_flight_on_the_node_count_against_min_free(memory_root, tmp_path, monkeypatch):
    _shards(memory_root)
    size = storage.size(sh.shard_uri(memory_root, "train-00000"))
    free = 10**12
    monkeypatch.setattr("shutil.disk_usage", lambda _: type("U", (), {"free": free})())  # sparse or not, frozen
    gate = _Gate(monkeypatch, sh.shard_uri(memory_root, "train-00000"))
    # room on the disk for one shard over min_free, not for two: a download in flight must be counted
    first, second = (ShardCache(tmp_path / "prepared", 2**30, free - size * 3 // 2) for _ in range(2))
    out = Future()
    thread = threading.Thread(target=lambda: out.set_result(_read(first, memory_root, 0)))
    thread.start()
    try:
        assert gate.entered.wait(BOUND)
        assert _read(second, memory_root, 1) == storage.read_bytes(sh.shard_uri(memory_root, "train-00001"))
    finally:
        gate.released.set()
        thread.join(BOUND)
    assert out.result(BOUND) == storage.read_bytes(sh.shard_uri(memory_root, "train-00000"))
    assert second.stats == {"downloaded": 0, "cache_hits": 0, "uncached": 1}
    assert first.stats["downloaded"] == 1 and _left(tmp_path / "prepared") == []


def test_the_processes_of_a_node_download_a_shard_once_the_others_wait_for_it(memory_root, tmp_path, monkeypatch):
    _shards(memory_root)
    uri = sh.shard_uri(memory_root, "train-00000")
    gate = _Gate(monkeypatch, uri)
    waiting = threading.Event()
    real_await = getattr(ShardCache, "_await", None)

    def await_(self, path):  # the second process reached its wait: now let the first finish
        waiting.set()
        return real_await(self, path)

    monkeypatch.setattr(ShardCache, "_await", await_, raising=False)
    first, second = (ShardCache(tmp_path / "prepared", 2**30) for _ in range(2))  # two processes' caches
    results = [Future(), Future()]
    threads = [threading.Thread(target=lambda c=c, f=f: f.set_result(_read(c, memory_root, 0)))
               for c, f in zip((first, second), results, strict=True)]
    threads[0].start()
    try:
        assert gate.entered.wait(BOUND)
        threads[1].start()
        assert any(e.wait(BOUND / 2) for e in (waiting, gate.other)), "the second reader neither waited nor downloaded"
    finally:
        gate.released.set()
        for t in threads:
            t.join(BOUND)
    assert [f.result(BOUND) for f in results] == [storage.read_bytes(uri)] * 2
    assert gate.calls == [uri]  # one download for the node
    assert second.stats == {"downloaded": 0, "cache_hits": 1, "uncached": 0}


def test_files_left_by_a_process_killed_mid_download_are_removed_and_live_ones_counted(memory_root, tmp_path):
    _shards(memory_root)
    size = storage.size(sh.shard_uri(memory_root, "train-00000"))
    folder = tmp_path / "prepared" / uri_key(memory_root)
    folder.mkdir(parents=True)
    dead = _dead_pid()
    (folder / f"train-00007.parquet.part-{dead}").write_bytes(b"x" * size)  # SIGKILLed mid-download
    (folder / "train-00008.parquet.reserved").write_text(f"{dead} {10 * size}")  # its claim
    (folder / f"train-00009.parquet.part-{dead}.part-{dead}").write_bytes(b"x" * 10)
    live = folder / f"train-00006.parquet.part-{__import__('os').getpid()}"  # a download in flight now
    live.write_bytes(b"x" * (2 * size))
    cache = ShardCache(tmp_path / "prepared", 3 * size + size // 2)  # the live download + one shard fit
    for n in range(3):
        assert _read(cache, memory_root, n) == storage.read_bytes(sh.shard_uri(memory_root, f"train-{n:05d}"))
    assert _left(tmp_path / "prepared") == [live.name]
    assert sorted(p.name for p in folder.glob("*.parquet")) == ["train-00002.parquet"]


def test_a_download_renamed_into_place_is_counted_once_not_evicted_by_the_next_claim(memory_root, tmp_path,
                                                                                      monkeypatch):
    _shards(memory_root)
    size = max(storage.size(sh.shard_uri(memory_root, f"train-{n:05d}")) for n in range(2))
    cache = ShardCache(tmp_path / "prepared", 5 * size // 2)  # two shards fit, not three
    real_settle = ShardCache._settle

    def settle(self, marker, path, n):  # shard 0 is in place, its marker not yet removed: the prefetch's other
        if path.name == "train-00000.parquet":  # thread claims shard 1 in that moment (seen under a loaded CPU)
            assert path.exists() and marker.exists()
            assert _read(cache, memory_root, 1) == storage.read_bytes(sh.shard_uri(memory_root, "train-00001"))
        real_settle(self, marker, path, n)

    monkeypatch.setattr(ShardCache, "_settle", settle)
    assert _read(cache, memory_root, 0) == storage.read_bytes(sh.shard_uri(memory_root, "train-00000"))
    folder = tmp_path / "prepared" / uri_key(memory_root)
    assert sorted(p.name for p in folder.glob("*.parquet")) == ["train-00000.parquet", "train-00001.parquet"]
    assert cache.stats["downloaded"] == 2 and _left(tmp_path / "prepared") == []


@pytest.mark.parametrize("backend", ["memory_root", "s3_root", "gcs_root"])
def test_a_cached_copy_not_matching_its_sha256_is_downloaded_again_older_data_is_checked_by_size(
        backend, request, tmp_path, monkeypatch):
    root = request.getfixturevalue(backend)  # the download path of each backend (its own .part handling)
    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    from voxrelay.paths import cache_dir

    checked, old = storage.join(root, "new"), storage.join(root, "old")
    index, old_index = _shards(checked, sha=True), _shards(old)
    for uri, idx in ((checked, index), (old, old_index)):
        source = _source(uri, idx, cache_dir("prepared"))
        want = [r.codes for r in source.get([0, 1, 2])]
        copy = cache_dir("prepared") / uri_key(uri) / "train-00000.parquet"
        torn = bytearray(copy.read_bytes())
        codes = pq.ParquetFile(copy).metadata.row_group(0).column(6)  # the codes' column chunk
        mid = codes.data_page_offset + codes.total_compressed_size // 2
        torn[mid: mid + 64] = bytes(64)  # same size: a copy a crash left half-written
        copy.write_bytes(bytes(torn))
        again = _source(uri, idx, cache_dir("prepared"))
        if uri == checked:
            assert all(np.array_equal(a.codes, b) for a, b in zip(again.get([0, 1, 2]), want, strict=True))
            assert again.stats["downloaded"] == 1
            assert copy.read_bytes() == storage.read_bytes(sh.shard_uri(uri, "train-00000"))
        else:  # no checksum to check against: the size is all there is (a hit)
            assert again._fetch(0) == bytes(torn)
            assert again.stats["cache_hits"] == 1 and again.stats["downloaded"] == 0


def _source(uri: str, index: dict, root: Path) -> ShardSource:
    return ShardSource(uri, K, ri.RowIndex.load(uri, index, "train"), ShardCache(root, 2**30), 2**30)


def test_the_readers_waits_are_bounded_and_say_so(memory_root, tmp_path, caplog):
    index = _shards(memory_root)
    stalled = threading.Event()
    stuck = threading.Event()

    def make_batch(ids):  # a shard read stalled on the bucket
        stalled.set()
        stuck.wait(BOUND)
        return {"ids": ids}

    stream = BatchStream(BatchPlan([10] * 8, [1.0] * 8, 0, batch_tokens=20), make_batch, ahead=2)
    builder = _Builder(stream, stream.cursor)  # what BatchStream starts at its first batch
    builder.STOP_WAIT_S = 0.01
    done = threading.Event()
    closer = threading.Thread(target=lambda: (stalled.wait(BOUND), builder.stop(), done.set()), daemon=True)
    try:
        with caplog.at_level(logging.WARNING):
            closer.start()
            assert done.wait(BOUND / 2), "the batch builder's stop waited for a stalled batch without a bound"
            source = ShardSource(memory_root, K, ri.RowIndex.load(memory_root, index, "train"),
                                 ShardCache(tmp_path / "prepared", 2**30), 2**30, close_wait_s=0.01)
            source._executor().submit(stuck.wait, BOUND)
            source._pending[0] = source._executor().submit(stuck.wait, BOUND)
            closed = threading.Event()
            threading.Thread(target=lambda: (source.close(), closed.set()), daemon=True).start()
            assert closed.wait(BOUND / 2), "ShardSource.close waited for a stalled download without a bound"
    finally:
        stuck.set()
    text = caplog.text
    assert "did not stop within" in text and "still running" in text


def test_a_sharded_save_that_never_finishes_stops_the_wait_with_a_message():
    from voxrelay.checkpoint.shard_saver import ShardSaver

    saver = ShardSaver()
    saver.WAIT_S = 0.01
    saver.pending = Future()  # a save whose write or collective hangs
    out = Future()
    threading.Thread(target=lambda: _capture(saver.wait, out), daemon=True).start()
    err = out.result(BOUND / 2)
    assert isinstance(err, TimeoutError) and "has not finished after" in str(err)
    saver.pending = None


def _capture(call, out: Future) -> None:
    try:
        call()
        out.set_result(None)
    except BaseException as err:  # noqa: BLE001 - the test looks at it
        out.set_result(err)


# A real kernel ENOSPC (issue 33 H3 measured it on a 64 MiB tmpfs): the cache on a 256 KiB tmpfs in a mount
# namespace of the script's own; the disk is filled (by "someone else": a staged checkpoint) right as the download
# starts, after the min_free check passed.
_FULL_MID_DOWNLOAD = r'''
import errno, logging, sys
from pathlib import Path
import numpy as np
from voxrelay import storage
from voxrelay.data import shards as sh
from voxrelay.data.shard_cache import ShardCache

logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
root, disk = "memory://bucket", Path(sys.argv[1])
rng = np.random.default_rng(0)
for n in range(2):
    rows = [sh.EncodedUtterance(str(i), "t", None, None, 1.0, rng.integers(-2**15, 2**15, (2, 8000), dtype=np.int16))
            for i in range(4)]
    storage.write_bytes(sh.shard_uri(root, f"s{n}"), sh.encode_table(rows))
real = storage.get_file

def get_file(src, local):
    try:
        with open(disk / "checkpoint", "ab") as f:  # the staging disk's other tenant fills it
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError as err:
        assert err.errno == errno.ENOSPC, err
    real(src, local)

storage.get_file = get_file
cache = ShardCache(disk / "prepared", 2**30)
got = [cache.read(sh.shard_uri(root, f"s{n}"), disk / "prepared" / f"s{n}.parquet") for n in range(2)]
assert got == [storage.read_bytes(sh.shard_uri(root, f"s{n}")) for n in range(2)]
print("STATS", cache.stats, sorted(p.name for p in (disk / "prepared").iterdir()))
'''


def test_a_real_full_disk_mid_download_reads_the_shard_into_memory(tmp_path):
    if not can_hide_folders():
        pytest.skip("needs unshare and mount (root or user namespaces)")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "full.py"
    script.write_text(_FULL_MID_DOWNLOAD)
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          f'mount -t tmpfs -o size=256k tmpfs "{disk}" && exec "$@"', "sh", sys.executable,
                          str(script), str(disk)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "STATS {'downloaded': 1, 'cache_hits': 0, 'uncached': 2} ['.lock']" in res.stdout, res.stdout
    assert res.stdout.count("WARNING") == 1 and "No space left on device" in res.stdout, res.stdout


# Another process of the node mid-download, for real: it builds the same in-memory "bucket" (same seed, same
# bytes), claims a shard, writes part of it, says READY and waits for a line on stdin (or a SIGKILL).
_BUCKET = r'''
import numpy as np
from voxrelay import storage
from voxrelay.data import shards as sh

def bucket(root):
    rng = np.random.default_rng(5)
    for n in range(2):
        rows = [sh.EncodedUtterance(str(i), "t", None, None, 1.0, rng.integers(0, 1000, (2, 500), dtype=np.int16))
                for i in range(3)]
        storage.write_bytes(sh.shard_uri(root, f"s{n}"), sh.encode_table(rows))
'''
_HOLDER = _BUCKET + r'''
import os
import sys
from pathlib import Path
from voxrelay.data.shard_cache import ShardCache

bucket("memory://bucket")
real = storage.get_file

def get_file(src, local):
    Path(f"{local}.part-{os.getpid()}").write_bytes(b"x" * 1000)  # the first bytes, where storage.get_file puts them
    print("READY", flush=True)
    sys.stdin.readline()
    real(src, local)

storage.get_file = get_file
cache = ShardCache(Path(sys.argv[1]), 2**30)
cache.read(sh.shard_uri("memory://bucket", "s0"), Path(sys.argv[1]) / "s0.parquet")
print("DONE", cache.stats, flush=True)
'''


def _holder(tmp_path: Path) -> subprocess.Popen:
    script = tmp_path / "holder.py"
    script.write_text(_HOLDER)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "prepared")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "READY"  # it holds the download of s0 now
    return proc


def _bucket() -> str:
    env: dict = {}
    exec(_BUCKET, env)  # the holder's bucket, byte for byte
    env["bucket"]("memory://bucket")
    return "memory://bucket"


def test_another_process_downloading_a_shard_is_waited_for_not_repeated(tmp_path, monkeypatch):
    root = _bucket()
    holder = _holder(tmp_path)
    waiting = threading.Event()
    real_await = getattr(ShardCache, "_await", None)
    monkeypatch.setattr(ShardCache, "_await", lambda self, path: (waiting.set(), real_await(self, path))[1],
                        raising=False)
    cache = ShardCache(tmp_path / "prepared", 2**30)
    out: Future = Future()
    reader = threading.Thread(target=lambda: out.set_result(cache.read(sh.shard_uri(root, "s0"),
                                                                       tmp_path / "prepared" / "s0.parquet")))
    try:
        reader.start()
        assert any(w() for w in (lambda: waiting.wait(BOUND / 2), lambda: out.exception(BOUND / 2) is None))
    finally:
        holder.communicate("go\n", timeout=BOUND)
        reader.join(BOUND)
    assert out.result(BOUND) == storage.read_bytes(sh.shard_uri(root, "s0"))
    assert cache.stats == {"downloaded": 0, "cache_hits": 1, "uncached": 0}  # its copy, not a second download
    assert holder.returncode == 0


def test_a_process_killed_mid_download_leaves_nothing_that_blocks_or_fills_the_cache(tmp_path):
    root = _bucket()
    holder = _holder(tmp_path)
    holder.kill()
    holder.wait()
    folder = tmp_path / "prepared"
    assert any(f".part-{holder.pid}" in name for name in _left(folder))  # what a SIGKILL leaves
    cache = ShardCache(folder, 2**30)
    for n in (1, 0):  # the scan of the first download removes them; the killed one's shard is downloaded
        assert cache.read(sh.shard_uri(root, f"s{n}"), folder / f"s{n}.parquet") == \
            storage.read_bytes(sh.shard_uri(root, f"s{n}"))
    assert _left(folder) == [] and cache.stats["downloaded"] == 2


def test_a_download_not_matching_its_index_sha256_is_refused_naming_the_shard(memory_root, tmp_path):
    index = _shards(memory_root, sha=True)
    storage.write_bytes(sh.shard_uri(memory_root, "train-00001"),
                        storage.read_bytes(sh.shard_uri(memory_root, "train-00002")))  # changed under the run
    source = _source(memory_root, index, tmp_path / "prepared")
    with pytest.raises(storage.StorageError, match=r"train-00001\.parquet does not match its sha256.*prepare"):
        source.get([3])
