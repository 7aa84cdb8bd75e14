"""Checkpoint folders and their manifests, in the run folder (any storage) or on local staging disk.

A checkpoint is a folder ``step-NNNNNNNN/`` with its files and ``manifest.json`` (step, time,
files with size and sha256, metrics), written LAST: no manifest, no checkpoint. Verification
re-hashes every file; a damaged checkpoint is skipped with a warning that names the file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from voxrelay import storage
from voxrelay.checkpoint.fence import FencedWriter
from voxrelay.checkpoint.format import ELSEWHERE, FORMAT_VERSION, MANIFEST, PART_SUFFIX  # noqa: F401 (defined in checkpoint/format.py)
from voxrelay.errors import UserError

log = logging.getLogger(__name__)


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing or damaged, or cannot be written; the message says which and what to do."""


class CheckpointVanished(CheckpointError):
    """A committed checkpoint's file was deleted while it was read (retention of a run training beside us)."""


class PartsMissing(OSError):
    """Files of a checkpoint that other machines of the job upload are not (yet) in the bucket: its commit waits."""


@dataclass
class Checkpoint:
    step: int
    uri: str  # folder: a storage URI (committed) or a local path (staged)
    manifest: dict
    durable: bool  # True when committed in the run folder

    @property
    def metrics(self) -> dict:
        return self.manifest.get("metrics", {})


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def parse_step(name: str) -> int | None:
    return int(name[5:]) if name.startswith("step-") and name[5:].isdigit() else None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_manifest(manifest: object) -> dict:
    """The manifest if well formed, else CheckpointError saying what is wrong.

    Its file names are joined to local folders when fetching, verifying and uploading: a tampered
    manifest (in a shared bucket) naming ``../x`` or ``/etc/x`` must not reach outside them, so
    every name must be a plain file name.
    """
    if not isinstance(manifest, dict) or not isinstance(manifest.get("step"), int):
        raise CheckpointError(f"{MANIFEST} is not a checkpoint manifest (no integer step)")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise CheckpointError(f"{MANIFEST} has no file list")
    for name, meta in files.items():
        if not _plain_name(name):
            raise CheckpointError(f"{MANIFEST} names {name!r}, which is not a plain file name inside the checkpoint")
        if not (isinstance(meta, dict) and isinstance(meta.get("size"), int) and isinstance(meta.get("sha256"), str)):
            raise CheckpointError(f"{MANIFEST} entry of {name} has no integer size and sha256")
    elsewhere = manifest.get(ELSEWHERE, [])
    if not isinstance(elsewhere, list) or any(not isinstance(n, str) or n not in files for n in elsewhere):
        raise CheckpointError(f"{MANIFEST}'s {ELSEWHERE} list must name files of its file list, not {elsewhere!r}")
    return manifest


def _plain_name(name: object) -> bool:
    return storage.is_plain_name(name)  # the checked join's rule for a single file name


def make_manifest(step: int, folder: Path, names: list[str], extra: dict) -> dict:
    files = {n: {"size": (folder / n).stat().st_size, "sha256": sha256_file(folder / n)} for n in names}
    return {"format_version": FORMAT_VERSION, "step": step, "time": time.time(), "files": files, **extra}


class CommittedStore:
    """Committed checkpoints under ``<run>/checkpoints/`` in storage, with retention.

    ``guard`` (the run's lease check) is called before every object written or deleted (:mod:`.fence`): it raises
    when this session may no longer write to the run folder. ``protected``: steps retention never
    deletes (the checkpoint this session resumed from)."""

    def __init__(self, root_uri: str, keep_last: int = 2, keep_every: int | None = None, keep_best: bool = False,
                 guard: Callable[[], None] | None = None):
        self.root_uri = root_uri
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.keep_best = keep_best
        self.guard = guard
        self.writer = FencedWriter(guard)  # every object written or deleted: the lease checked right before it
        self.parts_wait_s = 600.0  # how long a commit waits for the files other machines upload (then retried)
        self.protected: set[int] = set()
        self.unreadable: dict[str, str] = {}  # folder name -> why its manifest.json cannot be read (last list())
        self._problems: dict[int, str | None] = {}  # step -> what is wrong with its files (None: whole)

    def list(self) -> list[Checkpoint]:
        """Committed checkpoints, newest first (manifests read, files not verified); the folders whose
        manifest exists but cannot be read are in ``unreadable`` (damaged, never deleted as leftovers)."""
        out, self.unreadable = [], {}
        for name in storage.listdir(self.root_uri):
            step = parse_step(name)
            if step is None:
                continue
            uri = storage.join(self.root_uri, name)
            try:
                manifest = check_manifest(storage.read_json(storage.join(uri, MANIFEST)))
            except FileNotFoundError:
                continue  # not committed (an upload cut short)
            except (ValueError, KeyError, CheckpointError) as err:
                log.warning("ignoring %s: damaged manifest (%s)", uri, err)
                self.unreadable[name] = f"its {MANIFEST} cannot be read: {err}"
                continue
            out.append(Checkpoint(step, uri, manifest, durable=True))
        return sorted(out, key=lambda c: c.step, reverse=True)

    def upload(self, folder: Path, manifest: dict, parts_wait_s: float | None = None) -> Checkpoint:
        """Copy a staged checkpoint folder's files, check their sizes in storage, then write its
        manifest (the commit). The files the manifest lists as ``elsewhere`` (shards staged on other machines
        of the job) are uploaded by those machines: the commit waits up to ``parts_wait_s`` (default
        ``self.parts_wait_s``) for them, else raises :class:`PartsMissing`."""
        check_manifest(manifest)
        uri = storage.join(self.root_uri, step_name(manifest["step"]))
        elsewhere = set(manifest.get(ELSEWHERE, ()))
        self.upload_files(folder, manifest["step"], [n for n in manifest["files"] if n not in elsewhere])
        ckpt = Checkpoint(manifest["step"], uri, manifest, durable=True)
        wait_s = self.parts_wait_s if parts_wait_s is None else parts_wait_s
        problem = self._wait_for_parts(ckpt, elsewhere, wait_s) if elsewhere else self._check_sizes(ckpt)
        if problem:  # e.g. a copy cut short: retried, never committed as it is
            raise OSError(errno.EIO, f"the upload of {uri} is incomplete: {problem}")
        self.writer.write_json(storage.join(uri, MANIFEST), manifest)
        self._problems[ckpt.step] = None
        return ckpt

    def upload_files(self, folder: Path, step: int, names: list[str]) -> None:
        """Copy files of ``folder`` into the checkpoint folder of ``step`` in storage (no manifest: not a commit)."""
        uri = storage.join(self.root_uri, step_name(step))
        for name in names:
            self.writer.put_file(folder / name, storage.join(uri, name))  # taken over meanwhile: not one more

    def upload_part(self, folder: Path, step: int, files: dict[str, dict]) -> None:
        """Another machine's files of the checkpoint of ``step`` (name -> size and sha256 as written), then its part
        manifest: what the committer checks them against (an earlier upload of the same step, a fenced old job's,
        has the same sizes but not the same sha256)."""
        names = sorted(files)
        self.upload_files(folder, step, names)
        part = storage.join(self.root_uri, step_name(step), names[0] + PART_SUFFIX)
        self.writer.write_json(part, {"step": step, "files": {n: files[n] for n in names}})

    def upload_part_retrying(self, folder: Path, step: int, files: dict[str, dict], base_backoff: float,
                             max_backoff: float) -> None:
        """:meth:`upload_part`, transient failures retried with backoff for as long as the committer waits for the
        parts (``parts_wait_s``)."""
        deadline, delay = time.monotonic() + self.parts_wait_s, base_backoff
        while True:
            try:
                return self.upload_part(folder, step, files)
            except Exception as err:
                if not storage.is_transient(err, io_errors=True) or time.monotonic() + delay > deadline:
                    raise
                log.warning("upload of this machine's part of step %d failed (%s: %s); retrying in %.1fs", step,
                            type(err).__name__, err, delay)
                time.sleep(delay)  # a backoff, not a synchronisation
                delay = min(delay * 2, max_backoff)

    def _wait_for_parts(self, ckpt: Checkpoint, elsewhere: set[str], wait_s: float) -> str | None:
        """Poll the listing until the files other machines upload are there, each recorded with the manifest's
        sha256 in its machine's part manifest; what is still wrong after ``wait_s``: PartsMissing when only their
        files are missing or stale, a message for a problem of our own."""
        deadline, pause = time.monotonic() + wait_s, 0.1
        while True:
            problems = self._part_problems(ckpt, elsewhere)
            ours = [why for name, why in problems.items() if name not in elsewhere]
            if not problems or ours:
                return ours[0] if ours else None
            if time.monotonic() >= deadline:
                raise PartsMissing(errno.ETIMEDOUT, f"the upload of {ckpt.uri} waits for the shards staged on the "
                                   f"job's other machines: {next(iter(problems.values()))} after {wait_s:.0f} s")
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 5.0)

    def _part_problems(self, ckpt: Checkpoint, elsewhere: set[str]) -> dict[str, str]:
        """:meth:`_size_problems`, and for the files of ``elsewhere``: their part manifest records another sha256
        than the checkpoint's manifest, or there is none (a stale upload)."""
        problems, recorded = self._size_problems(ckpt), {}
        for name in storage.file_sizes(ckpt.uri):
            if name.endswith(PART_SUFFIX):
                try:
                    files = storage.read_json(storage.join(ckpt.uri, name))["files"]
                    recorded |= {n: m.get("sha256") for n, m in files.items()}
                except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
                    continue  # being written, or not ours to trust: its files count as not uploaded yet
        for name in sorted(elsewhere - problems.keys()):
            if recorded.get(name) != ckpt.manifest["files"][name]["sha256"]:
                problems[name] = (f"{name} in the bucket is not the one written for this checkpoint (no part manifest "
                                  "records it)" if name not in recorded else f"{name} in the bucket is a stale "
                                  "upload (its part manifest records another sha256)")
        return problems

    def _check_sizes(self, ckpt: Checkpoint) -> str | None:
        return next(iter(self._size_problems(ckpt).values()), None)

    def _size_problems(self, ckpt: Checkpoint) -> dict[str, str]:
        """File name -> what is wrong with it in storage (missing, or another size than the manifest says)."""
        sizes = storage.file_sizes(ckpt.uri)
        return {name: f"{name} is missing" if name not in sizes else
                f"{name} has {sizes[name]} bytes, the manifest says {meta['size']}"
                for name, meta in ckpt.manifest["files"].items() if sizes.get(name) != meta["size"]}

    def problem(self, ckpt: Checkpoint) -> str | None:
        """What is wrong with a committed checkpoint's files (missing, or another size than its manifest
        says; one listing, remembered), or None. The sha256 is checked when it is loaded."""
        if ckpt.step not in self._problems:
            self._problems[ckpt.step] = self._check_sizes(ckpt)
        return self._problems[ckpt.step]

    def fetch(self, ckpt: Checkpoint, dest: Path) -> Path:
        """Download and verify a committed checkpoint into ``dest``; raises CheckpointError if damaged."""
        check_manifest(ckpt.manifest)  # before any name is joined to ``dest``
        dest.mkdir(parents=True, exist_ok=True)
        needed = {name: meta for name, meta in ckpt.manifest["files"].items()
                  if not ((dest / name).exists() and (dest / name).stat().st_size == meta["size"]
                          and sha256_file(dest / name) == meta["sha256"])}
        problem = self.problem(ckpt) if needed else None  # one listing before gigabytes are downloaded
        if problem:
            raise self._gone_or_damaged(ckpt, problem)
        for name in needed:
            try:
                storage.get_file(storage.join(ckpt.uri, name), storage.checked_join(dest, name, MANIFEST, single=True))
            except FileNotFoundError:
                raise self._gone_or_damaged(ckpt, f"{name} is missing") from None
        verify_folder(dest, ckpt.manifest)
        return dest

    def _gone_or_damaged(self, ckpt: Checkpoint, problem: str) -> CheckpointError:
        """Deleted since it was listed (its manifest is gone too: retention of a run training beside this
        reader), or damaged."""
        if storage.exists(storage.join(ckpt.uri, MANIFEST)):
            return CheckpointError(problem)
        self._problems.pop(ckpt.step, None)
        return CheckpointVanished(f"{problem}: deleted while it was read")

    def retain(self, pending: frozenset[int] | set[int] = frozenset()) -> None:
        """Delete the committed checkpoints retention does not keep (manifest first: never a half
        checkpoint), and uncommitted leftovers older than the newest kept one (an upload cut short), but not the
        steps still ``pending`` upload (what other machines already uploaded of them is waited for there).

        Only checkpoints whose files are whole count toward ``keep_last`` (and qualify for ``keep_every``
        and ``keep_best``); ``protected`` ones are never deleted. A damaged one is deleted only once
        ``keep_last`` whole ones exist, so a run whose checkpoints are all damaged keeps them all."""
        committed = self.list()
        whole = [c for c in committed if self.problem(c) is None]
        keep = {c.step for c in whole[: self.keep_last]} | self.protected
        if self.keep_every:
            keep |= {c.step for c in whole if c.step % self.keep_every == 0}
        scored = [c for c in whole if "eval/loss" in c.metrics]
        if self.keep_best and scored:
            keep.add(min(scored, key=lambda c: c.metrics["eval/loss"]).step)
        doomed = [c for c in committed if c.step not in keep and (c in whole or len(whole) >= self.keep_last)]
        newest = max(keep, default=-1)
        steps = {c.step for c in committed}
        spared = steps | keep | set(pending)
        leftovers = [name for name in storage.listdir(self.root_uri) if name not in self.unreadable
                     and (step := parse_step(name)) is not None and step < newest and step not in spared]
        for ckpt in doomed:
            if ckpt not in whole:
                log.warning("deleting the damaged checkpoint %s (%s)", ckpt.uri, self.problem(ckpt))
            self.writer.delete(storage.join(ckpt.uri, MANIFEST))
            self.writer.delete(ckpt.uri, recursive=True)
            self._problems.pop(ckpt.step, None)
        for name in leftovers:
            self.writer.delete(storage.join(self.root_uri, name), recursive=True)


def verify_folder(folder: Path, manifest: dict, skip: frozenset[str] | set[str] = frozenset()) -> None:
    """Raise CheckpointError naming the first file whose size or sha256 differs from the manifest (the files
    in ``skip`` are not looked at: another machine's shards)."""
    check_manifest(manifest)
    for name, meta in manifest["files"].items():
        if name in skip:
            continue
        path = folder / name
        if not path.exists():
            raise CheckpointError(f"{name} is missing")
        size = path.stat().st_size
        if size != meta["size"]:
            raise CheckpointError(f"{name} has {size} bytes, the manifest says {meta['size']}")
        if sha256_file(path) != meta["sha256"]:
            raise CheckpointError(f"{name} does not match its sha256 in the manifest")


def read_local_manifest(folder: Path) -> dict | None:
    """The staged manifest of ``folder``; None when missing, unreadable or malformed (warned)."""
    try:
        return check_manifest(json.loads((folder / MANIFEST).read_text()))
    except (OSError, ValueError):
        return None
    except CheckpointError as err:
        log.warning("ignoring staged checkpoint %s: %s", folder, err)
        return None
