"""voxrelay.storage behaves the same on a local path, file://, memory://, S3 (moto) and GCS (fake-gcs-server).

The S3 and GCS roots talk to real servers on 127.0.0.1 started once per session (tests/conftest.py).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers.servers import reset_storage_cache
from voxrelay import storage
from voxrelay.storage import core
from voxrelay.storage import retrying as retry_module

BACKENDS = ["local", "file", "memory", "s3", "gcs"]
SHARED_BACKENDS = ["local", "file", "s3", "gcs"]  # visible to another process (memory:// is not)


@pytest.fixture
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty root of the backend named by the test's parameter."""
    kind = request.param
    if kind == "local":
        return str(tmp_path / "root")
    if kind == "file":
        return f"file://{tmp_path / 'root'}"
    return request.getfixturevalue(f"{kind}_root")


def on(*kinds: str):
    return pytest.mark.parametrize("root", kinds, indirect=True)


@on(*BACKENDS)
def test_bytes_text_json_round_trip(root: str) -> None:
    storage.write_bytes(storage.join(root, "a/b.bin"), b"\x00\x01binary")
    storage.write_bytes(storage.join(root, "empty.bin"), b"")
    storage.write_text(storage.join(root, "t.txt"), "héllo ✓")
    storage.write_json(storage.join(root, "meta/x.json"), {"step": 3, "files": ["a", "b"]})

    assert storage.read_bytes(storage.join(root, "a/b.bin")) == b"\x00\x01binary"
    assert storage.read_bytes(storage.join(root, "empty.bin")) == b""
    assert storage.read_text(storage.join(root, "t.txt")) == "héllo ✓"
    assert storage.read_json(storage.join(root, "meta/x.json")) == {"step": 3, "files": ["a", "b"]}
    assert storage.size(storage.join(root, "a/b.bin")) == 8
    assert storage.size(storage.join(root, "empty.bin")) == 0
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(storage.join(root, "missing.bin"))


@on(*BACKENDS)
def test_exists_on_objects_folders_and_missing(root: str) -> None:
    assert not storage.exists(root)
    storage.write_bytes(storage.join(root, "dir/sub/f.bin"), b"x")
    assert storage.exists(storage.join(root, "dir/sub/f.bin"))
    assert storage.exists(storage.join(root, "dir"))  # a "folder" is a prefix on object stores
    assert storage.exists(storage.join(root, "dir/sub/"))
    assert not storage.exists(storage.join(root, "dir/sub/nope.bin"))
    assert not storage.exists(storage.join(root, "di"))  # a prefix of a name is not a folder


@on(*BACKENDS)
def test_listdir_gives_direct_children_names(root: str) -> None:
    for name in ["a.txt", "b/c.txt", "b/d/e.txt", "z/y.txt"]:
        storage.write_text(storage.join(root, name), name)
    assert storage.listdir(root) == ["a.txt", "b", "z"]
    assert storage.listdir(storage.join(root, "b")) == ["c.txt", "d"]
    assert storage.listdir(storage.join(root, "b") + "/") == ["c.txt", "d"]
    assert storage.listdir(storage.join(root, "missing")) == []
    # Listings are not stale after writes and deletes through voxrelay.
    storage.write_text(storage.join(root, "b/new.txt"), "n")
    storage.delete(storage.join(root, "b/c.txt"))
    assert storage.listdir(storage.join(root, "b")) == ["d", "new.txt"]


@on(*SHARED_BACKENDS)
def test_sees_writes_and_deletes_of_another_process(root: str) -> None:
    """s3fs/gcsfs cache listings; a marker written by another rank must still be seen."""
    storage.write_text(storage.join(root, "d/old.txt"), "old")
    assert storage.listdir(storage.join(root, "d")) == ["old.txt"]  # fills the listing cache
    assert storage.exists(storage.join(root, "d/old.txt"))
    code = (
        "import sys; from voxrelay import storage; r = sys.argv[1]; "
        "storage.write_text(storage.join(r, 'd/new.txt'), 'new!'); storage.delete(storage.join(r, 'd/old.txt'))"
    )
    subprocess.run([sys.executable, "-c", code, root], check=True, env=os.environ.copy(), timeout=60)
    assert storage.exists(storage.join(root, "d/new.txt"))
    assert storage.size(storage.join(root, "d/new.txt")) == 4
    assert storage.read_text(storage.join(root, "d/new.txt")) == "new!"
    assert not storage.exists(storage.join(root, "d/old.txt"))
    assert storage.listdir(storage.join(root, "d")) == ["new.txt"]


@on(*BACKENDS)
def test_put_file_and_get_file(root: str, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(100_000))
    storage.put_file(src, storage.join(root, "up/blob.bin"))
    assert storage.size(storage.join(root, "up/blob.bin")) == 100_000

    dst = tmp_path / "down" / "nested" / "blob.bin"
    storage.get_file(storage.join(root, "up/blob.bin"), dst)
    assert dst.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in dst.parent.iterdir()) == ["blob.bin"]  # no partial download left

    missing = tmp_path / "down" / "missing.bin"
    with pytest.raises(FileNotFoundError):
        storage.get_file(storage.join(root, "up/missing.bin"), missing)
    assert sorted(p.name for p in missing.parent.iterdir()) == ["nested"]  # nor a partial file


@on(*BACKENDS)
def test_delete_file_folder_and_missing(root: str) -> None:
    for name in ["keep.txt", "gone.txt", "tree/a.txt", "tree/sub/b.txt"]:
        storage.write_text(storage.join(root, name), name)
    storage.delete(storage.join(root, "gone.txt"))
    assert not storage.exists(storage.join(root, "gone.txt"))
    storage.delete(storage.join(root, "tree"), recursive=True)
    assert not storage.exists(storage.join(root, "tree"))
    assert not storage.exists(storage.join(root, "tree/sub/b.txt"))
    assert storage.listdir(root) == ["keep.txt"]
    storage.delete(storage.join(root, "gone.txt"))  # missing is fine
    storage.delete(storage.join(root, "no-such-tree"), recursive=True)


@on(*BACKENDS)
def test_overwrite_replaces_whole_object(root: str) -> None:
    uri = storage.join(root, "ckpt/manifest.json")
    storage.write_bytes(uri, b"A" * 50_000)
    storage.write_bytes(uri, b"short")
    assert storage.read_bytes(uri) == b"short"
    assert storage.size(uri) == 5
    storage.put_file(__file__, uri)
    assert storage.read_bytes(uri) == Path(__file__).read_bytes()
    assert storage.listdir(storage.join(root, "ckpt")) == ["manifest.json"]  # no temporary names left
    if storage.is_local(root):
        folder = Path(storage.local_path(storage.join(root, "ckpt")))
        assert [p.name for p in folder.iterdir()] == ["manifest.json"]


def test_overwrite_is_atomic_for_concurrent_local_readers(tmp_path: Path) -> None:
    uri = str(tmp_path / "state.bin")
    old, new = b"o" * 2_000_000, b"n" * 2_000_000
    storage.write_bytes(uri, old)
    seen: set[bytes] = set()
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            got = storage.read_bytes(uri)
            seen.add(got[:1] + got[-1:] + (b"" if len(got) == 2_000_000 else b"!"))

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(10):
        storage.write_bytes(uri, new if i % 2 == 0 else old)
    done.set()
    thread.join()
    assert seen and seen <= {b"oo", b"nn"}  # never a torn (half old, half new or truncated) file


def test_join() -> None:
    assert storage.join("s3://b/root/", "a", "/b/", "c.txt") == "s3://b/root/a/b/c.txt"
    assert storage.join("gs://b", "x") == "gs://b/x"
    assert storage.join("/tmp/r", "x", "y") == "/tmp/r/x/y"
    assert storage.join("memory://r", 3) == "memory://r/3"  # type: ignore[arg-type]


def test_unsupported_scheme_names_the_url_and_the_choices() -> None:
    with pytest.raises(storage.StorageError) as info:
        storage.read_bytes("hdfs://cluster/data/x.bin")
    msg = str(info.value)
    assert "hdfs://cluster/data/x.bin" in msg
    assert "gs://" in msg and "s3://" in msg and "local path" in msg


def test_local_helpers() -> None:
    assert storage.is_local("relative/dir") and storage.is_local("file:///tmp/x")
    assert not storage.is_local("s3://b/x") and not storage.is_local("memory://x")
    assert storage.local_path("file:///tmp/x/") == "/tmp/x"
    with pytest.raises(storage.StorageError):
        storage.local_path("gs://b/x")


# --- retry -----------------------------------------------------------------------------------------


class Flaky:
    """Fails with ``error`` for the first ``failures`` calls, then returns ``"ok"``."""

    def __init__(self, failures: int, error: BaseException):
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The backoff delays retry asked for (recorded instead of slept)."""
    delays: list[float] = []
    monkeypatch.setattr(retry_module, "time", SimpleNamespace(sleep=delays.append))
    return delays


def test_an_endpoint_that_never_answered_is_not_retried_one_that_did_is(sleeps: list[float]) -> None:
    """A refused connection to a bucket that has not answered in this process (a wrong endpoint, no network) is
    raised at once naming the bucket; once the bucket answered, the same error is an outage and is retried."""
    refused = ConnectionRefusedError(111, "Connection refused")
    fn = Flaky(1, refused)
    with pytest.raises(storage.StorageUnavailable, match="s3://never-answered cannot be reached"):
        storage.retry(fn, "read s3://never-answered/x", attempts=5, base_delay=0.1)
    assert fn.calls == 1 and sleeps == []
    assert storage.retry(lambda: "ok", "read s3://answered-once/x") == "ok"
    fn = Flaky(2, refused)
    assert storage.retry(fn, "read s3://answered-once/y", attempts=5, base_delay=0.1) == "ok"
    assert fn.calls == 3 and len(sleeps) == 2


def test_retry_retries_transient_errors_with_growing_backoff(sleeps: list[float]) -> None:
    fn = Flaky(3, ConnectionResetError("connection reset by peer"))
    assert storage.retry(fn, "op", attempts=5, base_delay=0.1) == "ok"
    assert fn.calls == 4
    assert len(sleeps) == 3
    for i, delay in enumerate(sleeps):  # base * 2^i with ±50 % jitter
        assert 0.05 * 2**i <= delay <= 0.15 * 2**i


def test_retry_reraises_other_errors_at_once(sleeps: list[float]) -> None:
    fn = Flaky(1, ValueError("bad value"))
    with pytest.raises(ValueError, match="bad value"):
        storage.retry(fn, "op", attempts=5, base_delay=0.1)
    assert fn.calls == 1 and sleeps == []
    missing = Flaky(1, FileNotFoundError("nope"))
    with pytest.raises(FileNotFoundError):
        storage.retry(missing, "op", attempts=5)
    assert missing.calls == 1


def test_retry_http_errors_only_when_server_side() -> None:
    gcsfs_retry = pytest.importorskip("gcsfs.retry")
    unavailable = Flaky(1, gcsfs_retry.HttpError({"code": 503, "message": "unavailable"}))
    assert storage.retry(unavailable, "op", attempts=2, base_delay=0) == "ok"
    forbidden = Flaky(1, gcsfs_retry.HttpError({"code": 403, "message": "forbidden"}))
    # a permanent error: not retried, and turned into a user error naming the bucket and the fix
    with pytest.raises(storage.StorageError, match=r"access to gs://bkt was denied .*credentials"):
        storage.retry(forbidden, "write gs://bkt/run/x", attempts=2, base_delay=0)
    assert forbidden.calls == 1
    denied = Flaky(1, PermissionError("Access Denied"))
    with pytest.raises(storage.StorageError, match="access to s3://b was denied"):
        storage.retry(denied, "read s3://b/k", attempts=3, base_delay=0)
    assert denied.calls == 1


def test_retry_gives_up_after_attempts(sleeps: list[float]) -> None:
    fn = Flaky(100, ConnectionError("down"))
    with pytest.raises(storage.StorageUnavailable, match=r"s3://b did not answer .*after 3 attempts.*down") as info:
        storage.retry(fn, "read s3://b/k", attempts=3, base_delay=0.01)
    assert fn.calls == 3 and len(sleeps) == 2
    assert storage.is_transient(info.value)  # the uploader keeps retrying it later


def test_retry_defaults_come_from_environment(sleeps: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXRELAY_RETRY_ATTEMPTS", "2")
    monkeypatch.setenv("VOXRELAY_RETRY_BASE_DELAY", "0.2")
    fn = Flaky(100, ConnectionError("down"))
    with pytest.raises(storage.StorageUnavailable):
        storage.retry(fn, "op")
    assert fn.calls == 2 and 0.1 <= sleeps[0] <= 0.3
    monkeypatch.setenv("VOXRELAY_RETRY_ATTEMPTS", "many")
    with pytest.raises(storage.StorageError, match="VOXRELAY_RETRY_ATTEMPTS='many'"):
        storage.retry(fn, "op")


def test_s3_write_completes_across_server_restart(s3_server, s3_root: str, monkeypatch, caplog) -> None:
    """The server dies before an upload; the upload retries and lands once the server is back."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own retries off: voxrelay's retry must do it
    monkeypatch.setenv("VOXRELAY_RETRY_ATTEMPTS", "8")
    # The first backoff (1-3 s) outlasts a restart (~0.5 s), so the retry does not land between the
    # server answering and its (recreated) bucket existing.
    monkeypatch.setenv("VOXRELAY_RETRY_BASE_DELAY", "2")
    reset_storage_cache()
    uri = storage.join(s3_root, "ckpt/model.bin")
    data = os.urandom(1 << 20)
    errors: list[BaseException] = []

    def upload() -> None:
        try:
            storage.write_bytes(uri, data)
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    caplog.set_level(logging.WARNING, logger=core.__name__)
    s3_server.stop()
    thread = threading.Thread(target=upload)
    try:
        thread.start()
        deadline = time.monotonic() + 20
        while not any("retry 1/" in r.getMessage() for r in caplog.records):
            assert thread.is_alive() and time.monotonic() < deadline, f"upload never retried: {errors}"
            time.sleep(0.02)
    finally:
        s3_server.start()
    thread.join(timeout=30)
    assert not thread.is_alive() and errors == []
    assert storage.read_bytes(uri) == data
