"""Conditional writes of one small object: create it only if absent, replace it only if unchanged.

What a lease needs (``voxrelay.train.lease``): two writers racing for one object, exactly one wins.
Each backend's own primitive does it:

* GCS: ``ifGenerationMatch=0`` (create) / ``=<generation>`` (replace) on an upload; reads return
  the object's generation with its bytes (``X-Goog-Generation``).
* S3: ``If-None-Match: *`` (create) / ``If-Match: <ETag>`` (replace) on PutObject; GetObject returns
  the ETag with the bytes. (Supported by AWS S3 since 2024, MinIO, R2 and moto.)
* local: ``O_CREAT | O_EXCL`` (create); replace compares the bytes under an exclusive ``flock`` of
  the object's folder, which every call here takes (readers a shared one).

A version is an opaque string; a writer that changes nothing else must still change the bytes
(a lease carries a counter), so equal versions mean equal writes on every backend.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from voxrelay.storage.core import StorageError, _fs_path, _split, delete, fsync_file, join, retry
from voxrelay.storage.counters import CLASS_A, CLASS_B, count


class PreconditionFailed(StorageError):
    """The object changed (or appeared, or vanished) since the version the write was based on."""


@dataclass(frozen=True)
class Versioned:
    data: bytes
    version: str


def read_versioned(uri: str) -> Versioned | None:
    """The object's bytes and version, read in one request; None when it does not exist."""
    proto, path = _split(uri)
    got = _read_versioned(uri, proto, path)
    count(CLASS_B, read=len(got.data) if got is not None else 0)
    return got


def _read_versioned(uri: str, proto: str, path: str) -> Versioned | None:
    if proto == "file":
        if not os.path.isdir(os.path.dirname(path)):  # nothing to read, and a reader creates no folder
            return None
        with _folder_lock(path, fcntl.LOCK_SH):
            try:
                data = Path(path).read_bytes()
            except FileNotFoundError:
                return None
        return Versioned(data, _digest(data))
    try:
        return retry(lambda: _REMOTE[proto][0](uri), f"read {uri}")
    except FileNotFoundError:
        return None


def create_new(uri: str, data: bytes) -> str:
    """Write ``data`` only if ``uri`` does not exist (raises FileExistsError); returns its version."""
    proto, path = _split(uri)
    count(CLASS_A, written=len(data))
    if proto == "file":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with _folder_lock(path, fcntl.LOCK_EX):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # less the umask
            _write_fd(fd, data)
        return _digest(data)
    return retry(lambda: _REMOTE[proto][1](uri, data, None), f"create {uri}")


def replace_if(uri: str, data: bytes, version: str) -> str:
    """Replace ``uri`` with ``data`` only if its version is still ``version`` (else PreconditionFailed);
    returns the new version. A retried request whose first try did land also fails the precondition:
    the caller re-reads and recognises its own bytes."""
    proto, path = _split(uri)
    count(CLASS_A, written=len(data))
    if proto == "file":
        with _folder_lock(path, fcntl.LOCK_EX):
            try:
                current = Path(path).read_bytes()
            except FileNotFoundError:
                current = None
            if current is None or _digest(current) != version:
                raise PreconditionFailed(f"{uri} changed since version {version[:12]}")
            tmp = f"{path}.tmp-{os.getpid()}"
            _write_fd(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666), data)
            os.replace(tmp, path)
            fsync_file(os.path.dirname(path))
        return _digest(data)
    try:
        return retry(lambda: _REMOTE[proto][1](uri, data, version), f"replace {uri}")
    except FileNotFoundError:  # S3 answers If-Match on a missing object with 404
        raise PreconditionFailed(f"{uri} no longer exists") from None


def ignores_conditional_create(root: str, create: Callable[[str, bytes], object] = create_new) -> str | None:
    """Probe ``root`` once: create one new object twice, expecting the second to be refused (what a lease rests
    on). None when it was; else what happened (a store that ignores ``If-None-Match``: two sessions would both
    win a lease). ``create``: the conditional create under test. The probe object is deleted after."""
    uri = join(root, f".voxrelay-lease-probe-{uuid.uuid4().hex}")
    try:
        create(uri, b"first")
        try:
            create(uri, b"second")
        except FileExistsError:
            return None
        return f"it accepted a second create-if-absent of one object ({uri}): it ignores the condition"
    finally:
        with contextlib.suppress(OSError):
            delete(uri)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_fd(fd: int, data: bytes) -> None:
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def _folder_lock(path: str, kind: int) -> Iterator[None]:
    """flock of the object's folder: every conditional call on this machine's filesystem serialises on it."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, kind)
        yield
    finally:
        os.close(fd)  # releases the lock


# ---------------------------------------------------------------- GCS (gcsfs's authenticated session)

def _gcs_read(uri: str) -> Versioned:
    fs, path = _fs_path(uri)
    bucket, key = path.split("/", 1)
    headers, data = fs.call("GET", "b/{}/o/{}", bucket, key, alt="media")
    return Versioned(data, str(headers["X-Goog-Generation"]))


def _gcs_write(uri: str, data: bytes, version: str | None) -> str:
    """A multipart upload with ifGenerationMatch (0: only if absent). 412 -> FileExistsError in gcsfs."""
    fs, path = _fs_path(uri)
    bucket, key = path.split("/", 1)
    head = (f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{json.dumps({'name': key})}\n"
            "--==0==\nContent-Type: application/octet-stream\n\n").encode()
    try:
        out = fs.call("POST", f"{fs._location}/upload/storage/v1/b/{bucket}/o", uploadType="multipart",
                      headers={"Content-Type": 'multipart/related; boundary="==0=="'},
                      data=head + data + b"\n--==0==--", json_out=True, ifGenerationMatch=version or "0")
    except FileExistsError:
        if version is None:
            raise
        raise PreconditionFailed(f"{uri} changed since generation {version}") from None
    return str(out["generation"])


# ---------------------------------------------------------------- S3 (s3fs's client)

def _s3_read(uri: str) -> Versioned:
    from fsspec.asyn import sync

    fs, path = _fs_path(uri)
    bucket, key = path.split("/", 1)

    async def get() -> Versioned:
        resp = await fs._call_s3("get_object", Bucket=bucket, Key=key)
        async with resp["Body"] as body:
            return Versioned(await body.read(), resp["ETag"])

    return sync(fs.loop, get)


def _s3_write(uri: str, data: bytes, version: str | None) -> str:
    fs, path = _fs_path(uri)
    bucket, key = path.split("/", 1)
    condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
    try:
        return fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **condition)["ETag"]
    except FileExistsError:
        if version is None:
            raise
        raise PreconditionFailed(f"{uri} changed since ETag {version}") from None
    except OSError as err:  # s3fs turns If-Match's 412 (and 409 ConditionalRequestConflict) into EINVAL/EIO
        response = getattr(err.__cause__, "response", None)
        code = (response.get("Error") or {}).get("Code") if isinstance(response, dict) else None
        if code in ("PreconditionFailed", "ConditionalRequestConflict"):
            if version is None:
                raise FileExistsError(errno.EEXIST, f"{uri} exists") from None
            raise PreconditionFailed(f"{uri} changed since ETag {version}") from None
        raise


# ---------------------------------------------------------------- memory:// (one process: a lock is enough)

_MEMORY_LOCK = threading.Lock()


def _memory_read(uri: str) -> Versioned:
    fs, path = _fs_path(uri)
    data = fs.cat_file(path)
    return Versioned(data, _digest(data))


def _memory_write(uri: str, data: bytes, version: str | None) -> str:
    fs, path = _fs_path(uri)
    with _MEMORY_LOCK:
        current = fs.cat_file(path) if fs.exists(path) else None
        if version is None and current is not None:
            raise FileExistsError(errno.EEXIST, f"{uri} exists")
        if version is not None and (current is None or _digest(current) != version):
            raise PreconditionFailed(f"{uri} changed since version {version[:12]}")
        fs.pipe_file(path, data)
    return _digest(data)


_REMOTE = {"gcs": (_gcs_read, _gcs_write), "s3": (_s3_read, _s3_write), "memory": (_memory_read, _memory_write)}
