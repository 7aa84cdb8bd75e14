"""fsspec-backed storage primitives; see the package docstring."""

from __future__ import annotations

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

log = logging.getLogger(__name__)
T = TypeVar("T")

_PROTOCOLS = {"gs": "gcs", "gcs": "gcs", "s3": "s3", "memory": "memory", "file": "file"}
_EXTRAS = {"gcs": "gcs", "s3": "s3"}


class StorageError(RuntimeError):
    """A storage operation failed for a reason retrying will not fix; the message says what to do."""


def _transient_errors() -> tuple[type[BaseException], ...]:
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

        errs.append(HttpError)  # only retried when its code is 429/5xx, see _is_transient
    except ImportError:
        pass
    return tuple(errs)


TRANSIENT_ERRORS = _transient_errors()


def _is_transient(err: BaseException) -> bool:
    if not isinstance(err, TRANSIENT_ERRORS):
        return False
    code = getattr(err, "code", None)
    return not (isinstance(code, int) and code < 500 and code != 429)


def retry(fn: Callable[[], T], what: str, attempts: int = 5, base_delay: float = 0.5) -> T:
    """Call ``fn``; on a named transient error wait (exponential backoff + jitter) and retry."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as err:
            if not _is_transient(err) or attempt == attempts:
                raise
            delay = base_delay * 2 ** (attempt - 1) * (0.5 + random.random())
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
        if proto == "s3":
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            kw: dict[str, Any] = {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}
            return fsspec.filesystem("s3", **kw)
        if proto == "gcs":
            os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
            emulator = os.environ.get("STORAGE_EMULATOR_HOST")
            if emulator:
                return fsspec.filesystem("gcs", endpoint_url=emulator, token="anon", project="voxrelay")
            return fsspec.filesystem("gcs")
        return fsspec.filesystem(proto)
    except ImportError as err:
        extra = _EXTRAS.get(proto, proto)
        raise StorageError(
            f"the {proto} backend needs its package: pip install 'voxrelay[{extra}]' ({err})"
        ) from None


def _fs_path(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    proto, path = _split(uri)
    return _fs(proto), path


def join(base: str, *parts: str) -> str:
    out = base.rstrip("/")
    for p in parts:
        out = f"{out}/{str(p).strip('/')}"
    return out


def exists(uri: str) -> bool:
    fs, path = _fs_path(uri)
    return retry(lambda: fs.exists(path), f"exists {uri}")


def size(uri: str) -> int:
    fs, path = _fs_path(uri)
    return int(retry(lambda: fs.size(path), f"size {uri}"))


def listdir(uri: str) -> list[str]:
    """Names (not paths) of the direct children of ``uri``; [] when it does not exist."""
    fs, path = _fs_path(uri)

    def _ls() -> list[str]:
        try:
            fs.invalidate_cache(path)
            entries = fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != path.rstrip("/")})

    return retry(_ls, f"list {uri}")


def read_bytes(uri: str) -> bytes:
    fs, path = _fs_path(uri)
    return retry(lambda: fs.cat_file(path), f"read {uri}")


def read_text(uri: str) -> str:
    return read_bytes(uri).decode("utf-8")


def read_json(uri: str) -> Any:
    return json.loads(read_text(uri))


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole object atomically: a reader sees the old object or the new one, never half."""
    fs, path = _fs_path(uri)
    if fs.protocol in ("file", ("file", "local")) or "file" in fs.protocol:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return
    retry(lambda: fs.pipe_file(path, data), f"write {uri}")


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode("utf-8"))


def write_json(uri: str, obj: Any) -> None:
    write_text(uri, json.dumps(obj, indent=2, sort_keys=True))


def put_file(local: str | Path, uri: str) -> None:
    """Upload a local file (atomically, like write_bytes)."""
    fs, path = _fs_path(uri)
    if "file" in fs.protocol:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        shutil.copyfile(local, tmp)
        os.replace(tmp, path)
        return
    retry(lambda: fs.put_file(str(local), path), f"upload {local} -> {uri}")


def get_file(uri: str, local: str | Path) -> None:
    """Download to a local file (via a temporary name, so a partial download never looks complete)."""
    fs, path = _fs_path(uri)
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{local}.part-{os.getpid()}"
    retry(lambda: fs.get_file(path, tmp), f"download {uri}")
    os.replace(tmp, local)


def delete(uri: str, recursive: bool = False) -> None:
    """Delete an object (or a folder with ``recursive``); a missing one is not an error."""
    fs, path = _fs_path(uri)

    def _rm() -> None:
        try:
            fs.rm(path, recursive=recursive)
        except FileNotFoundError:
            pass

    retry(_rm, f"delete {uri}")
