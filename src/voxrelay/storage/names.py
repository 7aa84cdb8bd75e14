"""Names read from users' files (a path in a metadata.csv, a JSONL field, an audio path inside a saved dataset)
turned into locations under the dataset's root, local or in a bucket alike, and never outside it: a shared
dataset must not make ``prepare`` read (and upload into shards) other files of this machine or other objects
of the bucket.

Names read from the bucket itself (object keys listed, names inside its index/manifest/queue files) go through
:func:`checked_join`: whoever can write the bucket must not make voxrelay write outside the folder a name is
joined to (a hub-cache key ``snapshots/c/../../../.bashrc`` restored into ``~``)."""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import TypeVar

from voxrelay.storage.core import StorageError, _split, is_local

PathT = TypeVar("PathT", Path, str)


class OutsideRoot(StorageError):
    """A name that leaves its dataset's root (``..``, an absolute name, a symlink pointing out); the message
    says which and what to do."""


class UnsafeName(OutsideRoot):
    """A name read from the bucket that would leave the folder it is joined to, or that holds a separator where
    a single file or folder name belongs; the message names it, where it came from and the fix."""


def check_name(name: object, source: str, single: bool = False) -> str:
    """``name`` (read from ``source``: an object listing or a file in the bucket) if it can be joined under a
    folder: a relative ``/``-separated path without ``..``, ``.`` or empty parts, backslashes or NUL bytes;
    ``single``: one part only (a shard, checkpoint file, run or commit name). Else :class:`UnsafeName`."""
    why = _unsafe(name, single)
    if why:
        raise UnsafeName(f"{source} names {name!r}, which {why}; voxrelay never writes such a name, so something "
                         f"else wrote it into the bucket: remove {source} or the entry (and check who can write the "
                         "bucket). Nothing was written for it")
    return name  # type: ignore[return-value]


def _unsafe(name: object, single: bool) -> str | None:
    if not isinstance(name, str) or not name:
        return "is not a name"
    if "\\" in name or "\0" in name:
        return "holds a backslash or a NUL byte"
    if name.startswith("/"):
        return "is an absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "climbs out of its folder ('..')"
    if single and len(parts) > 1:
        return "holds a '/' where a single file or folder name belongs"
    if any(p in ("", ".") for p in parts):
        return "has an empty or '.' part"
    return None


def is_plain_name(name: object) -> bool:
    """Whether ``name`` is one file or folder name that :func:`checked_join` accepts (``single``)."""
    return _unsafe(name, single=True) is None


def checked_join(base: PathT, name: object, source: str, single: bool = False) -> PathT:
    """``base`` (a local :class:`~pathlib.Path` or a storage location) joined with ``name`` read from the bucket
    (:func:`check_name`): the one join of such names, so none can leave ``base``."""
    check_name(name, source, single)
    return base / name if isinstance(base, Path) else f"{base.rstrip('/')}/{name}"  # type: ignore[return-value]


def is_uri(location: str) -> bool:
    """A ``scheme://`` location (``gs://``, ``s3://``, ``file://``, ``memory://``), not a plain local path."""
    return "://" in location


def parent(location: str) -> str:
    """The folder holding ``location`` (a file's path or URI)."""
    if not is_uri(location):
        return str(Path(location).parent)
    scheme, rest = location.split("://", 1)
    head = rest.rstrip("/").rsplit("/", 1)[0] if "/" in rest.rstrip("/") else rest
    return f"{scheme}://{head}"


def basename(location: str) -> str:
    return location.rstrip("/").rsplit("/", 1)[-1]


def inside(root: str, name: str) -> str:
    """Where ``name`` (relative to ``root``, or an absolute path / full URI that lies inside it) is; raises
    :class:`OutsideRoot` when it would leave ``root``.

    A local root resolves symlinks first, so a link pointing outside cannot smuggle in other files (the
    result is the resolved absolute path). In a bucket there are no links: ``..`` is resolved by name and an
    absolute local name is refused (it cannot mean an object under the root)."""
    if is_local(root):
        return _inside_local(Path(_split(root)[1]), name)
    if is_uri(name):
        candidate = name
    elif name.startswith("/"):
        raise OutsideRoot(f"path {name!r} is absolute but the dataset is in a bucket ({root}); write it relative "
                          "to the dataset folder")
    else:
        candidate = f"{root.rstrip('/')}/{name}"
    scheme, rest = candidate.split("://", 1)
    root_scheme, root_rest = root.split("://", 1)
    path, base = posixpath.normpath("/" + rest), posixpath.normpath("/" + root_rest)
    if _split(candidate)[0] != _split(root)[0] or not (path == base or path.startswith(base.rstrip("/") + "/")):
        raise OutsideRoot(f"path {name!r} is outside the dataset folder {root!r}; keep files inside it")
    return f"{root_scheme}://{path.lstrip('/')}"


def _inside_local(root: Path, name: str) -> str:
    if is_uri(name) and not name.startswith("file://"):
        raise OutsideRoot(f"path {name!r} is outside the dataset folder {str(root)!r}; keep files inside it")
    raw = _split(name)[1] if name.startswith("file://") else name
    candidate = Path(raw) if Path(raw).is_absolute() else root / raw
    try:
        resolved = candidate.resolve()
    except (OSError, ValueError, RuntimeError) as err:  # a NUL byte, a symlink loop
        raise OutsideRoot(f"path {name!r} is not usable ({err})") from None
    if not resolved.is_relative_to(root.resolve()):
        raise OutsideRoot(f"path {name!r} is outside the dataset folder {str(root)!r}; keep files inside it")
    return str(resolved)
