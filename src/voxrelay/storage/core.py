"""fsspec-backed storage primitives; see the package docstring."""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import fsspec

from voxrelay.errors import UserError, one_line
from voxrelay.paths import writing
from voxrelay.storage.backends import endpoint_hint, open_filesystem, unreachable
from voxrelay.storage.counters import CLASS_A, CLASS_B, count

log = logging.getLogger(__name__)
T = TypeVar("T")

_PROTOCOLS = {"gs": "gcs", "gcs": "gcs", "s3": "s3", "memory": "memory", "file": "file"}
_EXTRAS = {"gcs": "gcs", "s3": "s3"}


class StorageError(UserError, RuntimeError):
    """A storage operation failed for a reason retrying will not fix; the message says what to do."""


@cache
def transient_errors() -> tuple[type[BaseException], ...]:
    """The named transient error classes; imported on first use (gcsfs, botocore and aiohttp take
    ~0.5 s to import, which `--help` and `status` of a local run must not pay)."""
    errs: list[type[BaseException]] = [ConnectionError, TimeoutError]
    try:  # aiohttp is what gcsfs/s3fs speak through
        import aiohttp

        errs += [aiohttp.ClientConnectionError, aiohttp.ServerTimeoutError, aiohttp.ClientPayloadError]
    except ImportError:
        pass
    try:
        from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, ReadTimeoutError

        errs += [EndpointConnectionError, ConnectionClosedError, ReadTimeoutError]
    except ImportError:
        pass
    try:
        from gcsfs.retry import HttpError

        errs.append(HttpError)  # only retried when its code is 429/5xx, see is_transient
    except ImportError:
        pass
    return tuple(errs)


class StorageDenied(StorageError):
    """The storage refused access (HTTP 401/403): the message names the bucket and what to check."""


class StorageUnavailable(StorageError):
    """The storage did not answer after every retry (network, outage): it may come back."""


def is_transient(err: BaseException, io_errors: bool = False) -> bool:
    """A named transient error (connection, timeout, HTTP 429/5xx), worth retrying. ``io_errors``:
    also any other OSError but a missing object or a denied access (a local disk that is full)."""
    if isinstance(err, StorageUnavailable):
        return True
    if denied(err):
        return False
    if io_errors and isinstance(err, OSError) and not isinstance(err, FileNotFoundError | PermissionError):
        return True
    if not isinstance(err, transient_errors()):
        return False
    code = getattr(err, "code", None)
    return not (isinstance(code, int) and code < 500 and code != 429)


def _bucket(what: str) -> str:
    uri = next((w for w in what.split() if "://" in w), what)
    scheme, _, rest = uri.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}" if rest else uri


_CREDENTIALS_FIX = (
    "check the credentials and that they may read and write it: for s3:// AWS_PROFILE or AWS_ACCESS_KEY_ID/"
    "AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for an S3-compatible server); for gs:// "
    "`gcloud auth application-default login`, GOOGLE_APPLICATION_CREDENTIALS, or on Colab "
    "google.colab.auth.authenticate_user()"
)


def denied(err: BaseException) -> bool:
    """Access refused (HTTP 401/403: revoked credentials, billing disabled, a retention lock), whatever
    exception class the SDK raises for it: never transient, retrying cannot fix it."""
    if isinstance(err, PermissionError | StorageDenied):
        return True
    code = getattr(err, "code", None)
    if isinstance(code, int) and code in (401, 403):
        return True
    # gcsfs raises a plain OSError("Forbidden: <path>\n<message>") for a 403 (gcsfs/retry.py)
    if type(err) is OSError and str(err).startswith(("Forbidden", "Unauthorized")):
        return True
    # s3fs keeps botocore's ClientError as the cause of the OSError it raises for codes it does not map
    response = getattr(err.__cause__, "response", None)
    meta = response.get("ResponseMetadata") if isinstance(response, dict) else None
    if isinstance(meta, dict) and meta.get("HTTPStatusCode") in (401, 403):
        return True
    return type(err).__name__ in ("DefaultCredentialsError", "RefreshError", "NoCredentialsError",
                                  "PartialCredentialsError")


RETRY_ATTEMPTS_ENV = "VOXRELAY_RETRY_ATTEMPTS"
RETRY_BASE_DELAY_ENV = "VOXRELAY_RETRY_BASE_DELAY"
_MAX_DELAY_S = 30.0


def _env_number(name: str, default: float, kind: type[int] | type[float], minimum: float) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return kind(default)
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        what = "a whole number" if kind is int else "a number"
        raise StorageError(f"{name}={raw!r} is invalid; set it to {what} >= {minimum} or unset it")
    return value


def retry(fn: Callable[[], T], what: str, attempts: int | None = None, base_delay: float | None = None,
          first_contact: bool = False) -> T:
    """Call ``fn``; on a named transient error wait (exponential backoff + jitter) and retry.
    ``first_contact``: an endpoint that cannot be reached at all (its host does not resolve, nothing listens)
    is not retried: raised at once as :class:`StorageUnavailable` naming the endpoint.

    ``attempts`` (calls in all) and ``base_delay`` (seconds before the first retry, doubled each time,
    capped at 30 s) default to $VOXRELAY_RETRY_ATTEMPTS (5) and $VOXRELAY_RETRY_BASE_DELAY (0.5).
    """
    if attempts is None:
        attempts = _env_number(RETRY_ATTEMPTS_ENV, 5, int, 1)
    if base_delay is None:
        base_delay = _env_number(RETRY_BASE_DELAY_ENV, 0.5, float, 0.0)
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as err:
            if denied(err):
                raise StorageDenied(f"access to {_bucket(what)} was denied ({what}: {type(err).__name__}: {err}); "
                                   f"{_CREDENTIALS_FIX}") from None
            if first_contact and (why := unreachable(err)):
                proto = _split(_bucket(what))[0]
                raise StorageUnavailable(
                    f"{_bucket(what)} cannot be reached ({what}): {why} ({one_line(err)[:200]}); check the network "
                    f"and the endpoint: {endpoint_hint(proto)}") from None
            if not is_transient(err):
                raise
            if attempt == attempts:
                raise StorageUnavailable(
                    f"{_bucket(what)} did not answer ({what}) after {attempts} attempts: {type(err).__name__}: "
                    f"{err}. Check the network and the endpoint ({RETRY_ATTEMPTS_ENV} sets the attempts)"
                ) from err
            delay = min(base_delay * 2 ** (attempt - 1), _MAX_DELAY_S) * (0.5 + random.random())
            log.warning("%s failed (%s: %s); retry %d/%d in %.1fs", what, type(err).__name__, err,
                        attempt, attempts - 1, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


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
            f"create it (`{make}`) or fix `root`; if it exists, {_CREDENTIALS_FIX}"
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
