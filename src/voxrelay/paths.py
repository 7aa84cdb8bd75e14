"""Local working folders (cache, staging), the process's place in a multi-process job, and the checks of
local paths a user gives (can this be read, can this be written) with the OSError a real use would meet."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from voxrelay.errors import UserError

# The layout of a run folder <root>/runs/<name>/ (here so that light commands need no heavy import)
CONFIG_SNAPSHOT = "config.yaml"  # the resolved config, written when training starts
CKPT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
LEASE_FILE = "lease.json"  # who writes the run now (voxrelay.checkpoint.lease)
USAGE_FILE = "usage.json"  # each session's GPU time and storage requests (voxrelay.cost.usage)
EXPORT_META = "voxrelay.json"  # in an export folder: tokenizer, vocabulary layout, speakers


class PathError(UserError):
    """A path the user gave cannot be read or written: the message names the option, the path, the errno's
    meaning and the fix."""


def probe_write(folder: str | Path) -> None:
    """Create, write a byte to and remove a file in ``folder``, or where it is missing in the folder above it
    that exists (where its first part will be made): raises the OSError a real write there would meet, its
    ``filename`` that folder. ``os.access`` is not enough: it says yes to root everywhere, and to anyone on
    /proc or /sys, where creating a file fails. Nothing is made for the check (a folder made and removed
    again would race with another process, a rank of the same job, checking the same new folder)."""
    folder = Path(folder).absolute()
    at = next(p for p in (folder, *folder.parents) if p.exists())
    if not at.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(at))
    probe = at / f".voxrelay-probe-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as err:
        raise _at(err, at) from None
    try:
        os.write(fd, b"\0")  # a full disk takes a name but not a byte
    except OSError as err:
        raise _at(err, at) from None
    finally:
        os.close(fd)
        os.unlink(probe)


def _at(err: OSError, path: str | Path) -> OSError:
    """``err`` with ``path`` as its filename (the folder, not the probe's name, is what the user can act on)."""
    return type(err)(err.errno, err.strerror or os.strerror(err.errno or 0), str(path))


def check_output(path: str | Path, folder: bool = False) -> None:
    """Raise the OSError that writing the file at local ``path`` (or, with ``folder``, files into the folder
    ``path``) would meet: the wrong kind of thing there, a folder that cannot be made or written."""
    path = Path(path).absolute()
    if folder and path.exists() and not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
    if not folder and path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    probe_write(path if folder else path.parent)


def check_input(path: str | Path, folder: bool = False) -> None:
    """Raise the OSError that reading the file (or listing the folder) at local ``path`` would meet."""
    info = os.stat(path)  # missing, or under a file: the OSError names the path
    if folder != stat.S_ISDIR(info.st_mode):
        code = errno.ENOTDIR if folder else errno.EISDIR
        raise OSError(code, os.strerror(code), str(path))
    if folder:
        with os.scandir(path):
            return
    if stat.S_ISREG(info.st_mode):  # not a pipe or a device: opening one could wait for ever
        with open(path, "rb"):
            return


def why(err: OSError, path: str | Path | None = None) -> str:
    """What went wrong, in one line: the errno's meaning (os.strerror), and where when that is not ``path``
    (a folder above it; a file where a folder should be)."""
    meaning = os.strerror(err.errno) if err.errno else str(err)
    where = os.fsdecode(err.filename) if err.filename is not None else None
    if err.errno == errno.ENOTDIR and where is not None:
        file = next((p for p in (Path(where), *Path(where).parents) if p.exists()), None)
        if file is not None and not file.is_dir():
            return f"{meaning} ({file} is a file, not a folder)"
    if where is not None and path is not None and os.path.abspath(where) != os.path.abspath(path):
        return f"{meaning} ({where})"
    return meaning


def check_path(path: str | Path, label: str, fix: str, writes: bool = False, folder: bool = False) -> None:
    """Refuse (:class:`PathError`) a local ``path`` given as ``label`` (``-o``, ``RUN``) that cannot be read,
    or with ``writes`` written: ``label 'path' cannot be written: <errno meaning>; <fix>``; else remember it."""
    try:
        (check_output if writes else check_input)(path, folder)
    except OSError as err:
        verb = "written" if writes else "read"
        raise PathError(f"{label} {str(path)!r} cannot be {verb}: {why(err, path)}; {fix}") from None
    remember(label, path, fix)


@dataclass(frozen=True)
class Given:
    """A local path the user gave: as written, absolute, where it came from (``-o``, ``root``), the fix."""

    label: str
    shown: str
    path: str
    fix: str


GIVEN: list[Given] = []  # this process's: the CLI names the one an OSError is on (voxrelay.cli.main)
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def remember(label: str, path: str | Path, fix: str) -> None:
    """Note a local path the user gave (checked): an OSError on it, later, is then the user's to fix."""
    GIVEN.append(Given(label, str(path), os.path.abspath(path), fix))


def _related(at: str, given: Given) -> bool:
    """``at`` is the given path, inside it, or a folder above it (one that could not be made)."""
    return at == given.path or at.startswith(given.path.rstrip("/") + "/") or given.path.startswith(
        at.rstrip("/") + "/")


def explain(err: OSError) -> str | None:
    """The one-line message of an OSError on a path the user gave (None for any other): where it came from, the
    path, the errno's meaning, the file it happened to, and what to do."""
    if not err.errno:
        return None
    for name in (err.filename, err.filename2):
        if name is None:
            continue
        at = os.path.abspath(os.fsdecode(name))
        for given in reversed(GIVEN):
            if _related(at, given):
                where = "" if at == given.path else f" ({at})"
                room = "make room on that disk, or " if err.errno in FULL else ""
                return f"{given.label} {given.shown!r}: {os.strerror(err.errno)}{where}; {room}{given.fix}"
    return None


def output_problem(path: str | Path) -> str | None:
    """Why a file cannot be written at local ``path`` (its folder cannot be made or written: a file where a
    folder must be, a read-only or pseudo filesystem, no permission, a full disk), or None. Checked before any
    work, so that minutes of it are not lost at the end."""
    try:
        probe_write(Path(path).absolute().parent)
    except OSError as err:
        return why(err)
    return None


_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how Rust libraries (safetensors, tokenizers) print an errno


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Writes to local ``path`` (a file, or a folder's files): an OSError without a file name (a full disk
    at ``write()``), or a Rust library's I/O error carrying an errno, is raised as an OSError naming ``path``,
    so that the CLI can say which of the user's paths failed and why."""
    try:
        yield
    except OSError as err:
        if err.filename is not None or err.errno is None:
            raise
        raise _at(err, path) from err
    except Exception as err:
        found = _OS_ERROR.search(str(err))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(path)) from err


def write_file(path: str | Path, data: bytes) -> None:
    """Write a whole local file through a temporary name beside it: an existing file at ``path`` is replaced
    only once the new one is complete (a full disk leaves the old one whole); an OSError names ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno is not None:
            raise _at(err, path) from None
        raise


def cache_dir(*parts: str) -> Path:
    """``$VOXRELAY_CACHE`` (default ``~/.cache/voxrelay``) / parts, created."""
    base = Path(os.environ.get("VOXRELAY_CACHE") or Path.home() / ".cache" / "voxrelay")
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def not_a_run(run_uri: str) -> str:
    """Why ``run_uri`` is no run folder, for an error message: it does not exist; it is a model folder in another
    format (a ``config.json``: an export in an upstream format, a hub snapshot); or it lacks the run's config."""
    import json

    from voxrelay import storage

    if not storage.exists(run_uri):
        return f"{run_uri} does not exist"
    model_json = storage.join(run_uri, "config.json")
    if storage.exists(model_json):
        try:
            kind = json.loads(storage.read_text(model_json)).get("model_type")
        except (ValueError, AttributeError):
            kind = None
        return (f"{run_uri} is a model folder in another format ({f'model_type {kind!r}' if kind else 'config.json'}"
                ": an export with --format <upstream>, or a hub model), not a run folder: voxrelay reads back runs and "
                "exports written with --format voxrelay (the default); load this one with its own library's "
                "from_pretrained, or train from it with model.init_from")
    return f"{run_uri} is not a run folder (no {CONFIG_SNAPSHOT})"


def run_location(run_uri: str) -> tuple[str, str] | None:
    """(root, name) of a run folder ``<root>/runs/<name>``, from where the folder is; None when ``run_uri`` is
    not laid out so. A run finds its prepared data from here, not from the root it was trained with: a root
    copied or synced elsewhere (another bucket, a local copy) works, from any working directory."""
    head, _, name = run_uri.rstrip("/").rpartition("/")
    parent, _, runs = head.rpartition("/")
    if runs != "runs" or not name or parent.endswith(":/"):  # s3://runs/x: the bucket itself is named "runs"
        return None
    return parent or ".", name


def located(cfg: dict, run_uri: str) -> dict:
    """A run's config snapshot (a dict) with ``root`` and ``name`` from where the run folder is."""
    where = run_location(run_uri)
    return cfg if where is None else {**cfg, "root": where[0], "name": where[1]}


def uri_key(uri: str) -> str:
    """A short, filesystem-safe key for a storage URI (to name its local cache folder); a local path is keyed by
    its absolute form, so ``./data`` and ``/home/me/data`` share one cache."""
    if "://" not in uri or uri.startswith("file://"):
        uri = os.path.abspath(uri.removeprefix("file://"))
    tail = "".join(c if c.isalnum() or c in "-_." else "_" for c in uri.rstrip("/").rsplit("/", 1)[-1])
    return f"{tail}-{hashlib.sha1(uri.encode()).hexdigest()[:10]}"


def rank_world() -> tuple[int, int]:
    """(rank, world size) from the torchrun/accelerate environment; (0, 1) when alone."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
