"""fsspec-backed storage primitives; see the package docstring."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import fsspec

from voxrelay.paths import writing
from voxrelay.storage.backends import open_filesystem
from voxrelay.storage.counters import CLASS_A, CLASS_B, count
from voxrelay.storage.retrying import (  # noqa: F401 (re-exported: the errors of every storage call)
    CREDENTIALS_FIX,
    StorageDenied,
    StorageError,
    StorageUnavailable,
    denied,
    is_transient,
    retry,
    transient_errors,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

_PROTOCOLS = {"gs": "gcs", "gcs": "gcs", "s3": "s3", "memory": "memory", "file": "file"}
_EXTRAS = {"gcs": "gcs", "s3": "s3"}


def _split(uri: str) -> tuple[str, str]:
    """URI -> (fsspec protocol, path inside that filesystem)."""
    if "://" in uri:
        scheme, rest = uri.split("://", 1)
        proto = _PROTOCOLS.get(scheme)
        if proto is None:
            raise StorageError(
                f"unsupported storage URL {uri!r}; use a local path, file://, gs://bucket/path or s3://bucket/path"
            )
        if proto == "file":
            return "file", os.path.abspath(rest)
        if proto == "memory":
            return "memory", "/" + rest.lstrip("/")
        return proto, rest.rstrip("/")
    return "file", os.path.abspath(uri)


def is_local(uri: str) -> bool:
    return _split(uri)[0] == "file"


def local_path(uri: str) -> str:
    """Absolute local path of a local URI (raises for remote ones)."""
    proto, path = _split(uri)
    if proto != "file":
        raise StorageError(f"{uri!r} is not a local path")
    return path


@cache
def _fs(proto: str) -> fsspec.AbstractFileSystem:
    try:
        return open_filesystem(proto)
    except ImportError as err:
        extra = _EXTRAS.get(proto, proto)
        raise StorageError(
            f"the {proto} backend needs its package: pip install 'voxrelay[{extra}]' ({err})"
        ) from None


def _fs_path(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    proto, path = _split(uri)
    return _fs(proto), path


def _fresh(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """Drop cached listings of ``path`` and its parents: s3fs/gcsfs answer exists/size/cat from a listing
    cached by an earlier ls, so objects written or deleted since by another process would be missed."""
    fs.invalidate_cache(path)
    return path


def check_root(uri: str) -> None:
    """Fail fast, naming the bucket and the fix, when a remote root's bucket does not exist, is not accessible,
    or cannot be reached at all (a local root is created as needed). The first contact with a bucket: an
    endpoint that does not resolve or refuses connections is not retried."""
    proto, path = _split(uri)
    if proto == "file":
        return _check_local_root(uri, Path(path))
    if proto == "memory":
        return
    fs, bucket = _fs(proto), path.split("/", 1)[0]
    scheme = uri.split("://", 1)[0]
    count(CLASS_B)  # the bucket's metadata
    if not retry(lambda: _bucket_exists(fs, proto, bucket), f"check {uri}", first_contact=True):
        make = f"aws s3 mb s3://{bucket}" if proto == "s3" else f"gcloud storage buckets create gs://{bucket}"
        raise StorageError(
            f"the bucket {scheme}://{bucket} (of root {uri}) does not exist or is not visible to these credentials; "
            f"create it (`{make}`) or fix `root`; if it exists, {CREDENTIALS_FIX}"
        )


def _bucket_exists(fs: fsspec.AbstractFileSystem, proto: str, bucket: str) -> bool:
    if proto != "s3":
        return fs.exists(_fresh(fs, bucket))
    try:  # HeadBucket itself: s3fs' exists() answers False for any error, a network down included
        fs.call_s3("head_bucket", Bucket=bucket)
    except FileNotFoundError:
        return False
    return True


def _check_local_root(uri: str, path: Path) -> None:
    """A local root is a folder, or can be made one (before minutes of work that could not be written)."""
    from voxrelay.paths import output_problem, remember

    if (problem := output_problem(path / "x")) is not None:
        raise StorageError(f"root {uri!r}: {problem}; set `root` to a folder you can write (or a new path)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StorageError(f"root {uri!r} cannot be created ({err.strerror or err}); set `root` to a folder "
                           "you can write") from None
    remember("root", path, "set `root` to a folder you can write")  # a full disk later: exit 2 naming it


def join(base: str, *parts: str) -> str:
    out = base.rstrip("/")
    for p in parts:
        out = f"{out}/{str(p).strip('/')}"
    return out


def exists(uri: str) -> bool:
    fs, path = _fs_path(uri)
    count(CLASS_B)
    return retry(lambda: fs.exists(_fresh(fs, path)), f"exists {uri}")


def size(uri: str) -> int:
    fs, path = _fs_path(uri)
    count(CLASS_B)
    return int(retry(lambda: fs.size(_fresh(fs, path)), f"size {uri}"))


def listdir(uri: str) -> list[str]:
    """Names (not paths) of the direct children of ``uri``; [] when it does not exist."""
    fs, path = _fs_path(uri)
    count(CLASS_A)  # a listing

    def _ls() -> list[str]:
        try:
            entries = fs.ls(_fresh(fs, path), detail=False)
        except FileNotFoundError:
            return []
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != path.rstrip("/")})

    return retry(_ls, f"list {uri}")


def file_sizes(uri: str) -> dict[str, int]:
    """Name -> size in bytes of the files directly under ``uri`` (one listing); {} when it does not exist."""
    fs, path = _fs_path(uri)
    count(CLASS_A)

    def _ls() -> dict[str, int]:
        try:
            entries = fs.ls(_fresh(fs, path), detail=True)
        except FileNotFoundError:
            return {}
        return {e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0) for e in entries
                if e.get("type") == "file"}

    return retry(_ls, f"list {uri}")


def tree_sizes(uri: str) -> dict[str, int]:
    """Relative path (``/``-separated) -> size of every file under ``uri``, at any depth; {} when it does not
    exist."""
    fs, path = _fs_path(uri)
    base = path.rstrip("/") + "/"
    count(CLASS_A)

    def _find() -> dict[str, int]:
        try:
            found = fs.find(_fresh(fs, path), detail=True)
        except FileNotFoundError:
            return {}
        return {name[len(base):]: int(e.get("size") or 0) for name, e in found.items()
                if e.get("type") == "file" and name.startswith(base)}

    return retry(_find, f"list {uri}")


def read_bytes(uri: str) -> bytes:
    fs, path = _fs_path(uri)
    data = retry(lambda: fs.cat_file(_fresh(fs, path)), f"read {uri}")
    count(CLASS_B, read=len(data))
    return data


def open_read(uri: str):
    """A seekable binary file on ``uri`` that reads by ranges (Parquet column projection of a remote shard);
    opening is retried, reads are not (the caller retries the whole read)."""
    fs, path = _fs_path(uri)
    count(CLASS_B)  # the open; the ranges read later are not counted
    return retry(lambda: fs.open(_fresh(fs, path), "rb"), f"open {uri}")


def read_text(uri: str) -> str:
    return read_bytes(uri).decode("utf-8")


def read_json(uri: str) -> Any:
    return json.loads(read_text(uri))


def file_mode() -> int:
    """The mode a new file gets from this process's umask: 0o666 less the umask (0o644 under the usual 022)."""
    try:  # read, not set: os.umask() can only be read by setting it, which races with other threads
        with open("/proc/self/status") as f:
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


def match_umask(path: str | Path) -> None:
    """Give the file ``path``, or every file under the folder ``path``, the mode :func:`file_mode`: files users
    take elsewhere (an export) read like their other files; libraries such as safetensors create theirs 0600."""
    root, mode = Path(path), file_mode()
    for file in [root] if root.is_file() else (p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        os.chmod(file, mode)


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole object atomically: a reader sees the old object or the new one, never half. A local file
    gets the umask's mode (:func:`file_mode`), not the temporary file's 0600."""
    count(CLASS_A, written=len(data))
    if is_local(uri):
        path = local_path(uri)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        try:
            os.fchmod(fd, file_mode())
            with writing(path), os.fdopen(fd, "wb") as f:  # a full disk names the file, not nothing
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_file(os.path.dirname(path))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return
    fs, path = _fs_path(uri)
    retry(lambda: fs.pipe_file(path, data), f"write {uri}")


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode("utf-8"))


def write_json(uri: str, obj: Any) -> None:
    write_text(uri, json.dumps(obj, indent=2, sort_keys=True))


def put_file(local: str | Path, uri: str) -> None:
    """Upload a local file (atomically, like write_bytes)."""
    fs, path = _fs_path(uri)
    count(CLASS_A, written=os.path.getsize(local))
    if is_local(uri):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            shutil.copyfile(local, tmp)
            fsync_file(tmp)  # on disk before the name points at it: a power loss leaves the old file or the new
            os.replace(tmp, path)
            fsync_file(os.path.dirname(path))  # and the rename itself
        finally:
            Path(tmp).unlink(missing_ok=True)
        return
    retry(lambda: fs.put_file(str(local), path), f"upload {local} -> {uri}")


def fsync_file(path: str | Path) -> None:
    """Flush a local file's (or a folder's entries') data to disk; a no-op on a filesystem that cannot
    (some FUSE mounts refuse fsync on a folder)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.ENOSYS):
            raise
    finally:
        os.close(fd)


def get_file(uri: str, local: str | Path) -> None:
    """Download to a local file (via a temporary name, so a partial download never looks complete)."""
    fs, path = _fs_path(uri)
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{local}.part-{os.getpid()}"
    try:
        retry(lambda: fs.get_file(_fresh(fs, path), tmp), f"download {uri}")
        count(CLASS_B, read=os.path.getsize(tmp))
        os.replace(tmp, local)
    finally:
        Path(tmp).unlink(missing_ok=True)


def delete(uri: str, recursive: bool = False) -> None:
    """Delete an object (or a folder with ``recursive``); a missing one is not an error."""
    fs, path = _fs_path(uri)
    if recursive:
        count(CLASS_A)  # the listing of what to delete; deletes themselves are free

    def _rm() -> None:
        try:
            fs.rm(path, recursive=recursive)
        except FileNotFoundError:
            pass

    retry(_rm, f"delete {uri}")
