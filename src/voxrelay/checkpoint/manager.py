"""CheckpointManager: save = stage locally + upload in the background; load = newest valid.

Layout in the run folder: ``<run>/checkpoints/step-00000100/{model.safetensors, train_state.pt,
manifest.json}``. ``model.safetensors`` holds the weights (a run with ``train.strategy=fsdp`` writes
per-rank DCP shards instead, see :mod:`voxrelay.checkpoint.sharded`); ``train_state.pt`` holds optimizer,
scheduler, RNG of every rank, data cursor, loop counters and the config; it is saved with
torch.save and read with ``weights_only=True`` (tensors and plain containers, never arbitrary
pickles). Loading considers committed checkpoints and staged ones not yet uploaded (a previous
session on this machine), newest first; a damaged one is skipped with a warning naming the file.

A committed checkpoint is read from a local copy in ``<staging>/fetched/step-N/`` that is removed
once loaded into memory, so local disk does not grow with every resume. In a multi-process job
the processes of one machine share that copy (one download); the main process's ``start()``,
called after every process has loaded, removes it.

A ``reader`` (synthesize, export, eval, status: a command beside a trainer on its machine) reads the staged
checkpoints but never writes or deletes in the staging folder, and never commits: its copies of committed
checkpoints go to a folder of its own (``$VOXRELAY_CACHE/read/<run>/<pid>-…``), removed once loaded.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import load_file

from voxrelay import storage
from voxrelay.checkpoint.files import load_state, model_writer, state_writer  # noqa: F401 (re-exported)
from voxrelay.checkpoint.format import FETCHED_DIR, MODEL_FILE, STATE_FILE  # noqa: F401 (defined in checkpoint/format.py)
from voxrelay.checkpoint.host import pid_alive
from voxrelay.checkpoint.sharded import is_sharded, read_model
from voxrelay.checkpoint.staging import Staging, Uploader, Writer
from voxrelay.checkpoint.store import (
    ELSEWHERE,
    FORMAT_VERSION,
    Checkpoint,
    CheckpointError,
    CheckpointVanished,
    CommittedStore,
    PartsMissing,
    check_manifest,
    sha256_file,
    step_name,
    verify_folder,
)
from voxrelay.paths import CKPT_DIR, cache_dir, rank_world, uri_key

log = logging.getLogger(__name__)


__all__ = ["CheckpointError", "CheckpointManager", "MODEL_FILE", "STATE_FILE", "load_state", "model_writer",
           "state_writer"]


class ResumePoint(NamedTuple):
    """The checkpoint a session resumes from, as :meth:`CheckpointManager.open` gives it: the committed or staged
    ``checkpoint``, its verified local ``folder`` (the weights, or DCP's shards, still in their files) and the
    ``state`` of ``train_state.pt`` (keys in :mod:`voxrelay.checkpoint.format`)."""

    checkpoint: Checkpoint
    folder: Path
    state: dict


class Health(NamedTuple):
    """How saving and uploading stand (:meth:`CheckpointManager.health`), what the training loop stops on."""

    fatal: str | None  # an upload error no retry fixes (HTTP 403): nothing more is uploaded
    failed_saves: int  # saves in a row that could not be staged (checkpoint.max_failed_saves stops the run)
    save_error: str | None  # why the last of them failed
    upload_error: str | None  # the last upload error, retried
    uploading: bool  # a checkpoint is staged or being staged and not committed yet


class CheckpointManager:
    def __init__(
        self,
        run_uri: str,
        keep_last: int = 2,
        keep_every: int | None = None,
        keep_best: bool = False,
        max_staged: int = 3,
        staging_dir: Path | None = None,
        guard: Callable[[], None] | None = None,
        reader: bool = False,
    ):
        self.run_uri = run_uri
        self.reader = reader  # reads only: never writes in the staging folder, never commits
        self.store = CommittedStore(storage.join(run_uri, CKPT_DIR), keep_last, keep_every, keep_best, guard)
        self.staging = Staging(staging_dir or cache_dir("staging", uri_key(run_uri)))
        self.uploader = Uploader(self.store, self.staging, max_staged)
        self.started = False

    # ------------------------------------------------------------------ saving

    def start(self) -> None:
        """Start the upload thread; staged checkpoints newer than the newest committed one (a
        previous session died before uploading them) are uploaded first. In a multi-process job,
        call it on the main process only once every process has loaded its checkpoint: it removes
        the fetched copies they shared."""
        if self.reader:
            raise RuntimeError(f"a reader of {self.run_uri} never saves, uploads or cleans the trainer's staging")
        self.staging.clean()
        shutil.rmtree(self.fetched_dir, ignore_errors=True)
        whole = [c for c in self.store.list() if self.store.problem(c) is None]  # a damaged newest supersedes nothing
        newest = whole[0].step if whole else -1
        self.uploader.durable_step = newest if whole else None
        hashes = {c.step: _hashes(c) for c in whole}
        for ckpt in reversed(self.staging.list()):
            # the same step committed with other bytes (stale parts, another session's save of it): the staged
            # copy may be the only good one, it is uploaded again rather than deleted
            if ckpt.step < newest or ckpt.step == newest and hashes[newest] == _hashes(ckpt):
                self.staging.remove(ckpt.step)
            else:
                self.uploader.submit(ckpt, trusted=False)  # a previous session's: re-hashed before upload
        self.uploader.start()
        self.started = True

    def save(self, step: int, writers: dict[str, Writer], extra: dict | None = None,
             expected_bytes: int = 0, background: bool = False) -> Checkpoint | None:
        """Save a checkpoint; ``writers`` hold copies of the state (see model_writer/state_writer).

        By default it is staged to local disk here and uploaded in the background; with
        ``background`` the staging happens in the upload thread too, so the caller only pays for
        the copies of the state (returns None). Not enough free staging space is an error here,
        before anything is written.
        """
        if not self.started:
            self.start()
        if self.holds(step):  # e.g. the save after an out-of-memory step: its step is already uploading
            log.info("the checkpoint of step %d is already saved or on its way; not saving it again", step)
            return None
        self.staging.check_space(step, expected_bytes)
        if background:
            self.uploader.submit_snapshot(step, writers, extra or {})
            return None
        ckpt = self.staging.stage(step, writers, extra or {})
        self.uploader.submit(ckpt)
        return ckpt

    def holds(self, step: int) -> bool:
        """True when the checkpoint of ``step`` is staged, on its way, committed by this session or the one it
        resumed from (verified when loaded)."""
        return self.uploader.holds(step) or step in self.store.protected

    def new_folder(self, step: int) -> Path:
        """A folder on the staging disk for a checkpoint written by every process (sharded)."""
        if not self.started:
            self.start()
        return self.staging.new_folder(step)

    def save_folder(self, step: int, folder: Path, files: dict[str, dict], extra: dict) -> Checkpoint:
        """Stage ``folder`` (from :meth:`new_folder`, its files written, ``files`` = name -> size and sha256
        as each writer reported them) with its manifest, and hand it to the upload thread."""
        manifest = {"format_version": FORMAT_VERSION, "step": step, "time": time.time(), "files": files, **extra}
        ckpt = self.staging.commit(step, folder, check_manifest(manifest))
        self.uploader.submit(ckpt)
        return ckpt

    def upload_part(self, step: int, folder: Path, names: list[str] | dict[str, dict]) -> None:
        """On a machine other than rank 0's (a job over several machines, each staging on its own disk): upload this
        process's files of the checkpoint of ``step`` (its DCP shards) from ``folder``, then remove them there
        (and the folder once the last process of the machine is done). Rank 0 commits the manifest once every
        machine's files are in the bucket, checked against the part manifest written after them (``names`` -> size
        and sha256 as hashed when written; a list: hashed here). Transient failures are retried with backoff for as
        long as rank 0's commit waits for the parts (``parts_wait_s``)."""
        files = names if isinstance(names, dict) else {n: {"size": (folder / n).stat().st_size,
                                                          "sha256": sha256_file(folder / n)} for n in names}
        self.store.upload_part_retrying(folder, step, files, self.uploader.base_backoff, self.uploader.max_backoff)
        for name in names:
            (folder / name).unlink(missing_ok=True)
        try:
            folder.rmdir()
        except OSError:  # another process of this machine still has its files there (it removes the folder)
            pass

    def tidy_local(self) -> None:
        """On a machine other than rank 0's, once every process loaded: remove leftovers of saves killed midway
        and the fetched copy of the checkpoint resumed from (rank 0's :meth:`start` does it on its machine)."""
        self.staging.clean()
        shutil.rmtree(self.fetched_dir, ignore_errors=True)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every staged checkpoint is committed; False if ``timeout`` ran out."""
        return self.uploader.wait(timeout)

    def close(self, timeout: float | None = None) -> bool:
        return self.uploader.close(timeout) if self.started else True

    @property
    def durable_step(self) -> int | None:
        return self.uploader.durable_step

    def io_stats(self) -> dict[str, float]:
        """What the run's log reports of checkpoint I/O: ``upload_mb_s`` (committed uploads' MB over their seconds;
        absent before the first), ``staging_backlog`` (staged checkpoints not yet committed) and
        ``staging_free_gb`` (free disk where checkpoints are staged, when it can be read)."""
        up = self.uploader
        out = {"staging_backlog": float(up.backlog())}
        folder = self.staging.folder
        while not folder.exists() and folder != folder.parent:  # not made yet: the disk it will be on
            folder = folder.parent
        try:
            out["staging_free_gb"] = shutil.disk_usage(folder).free / 1e9
        except OSError:  # a report, never a reason to stop training
            pass
        if up.uploaded[1] > 0:
            out["upload_mb_s"] = up.uploaded[0] / 1e6 / up.uploaded[1]
        return out

    # ------------------------------------------------------------------ what training asks of it

    def health(self) -> Health:
        up = self.uploader
        return Health(up.fatal, up.failed_saves, up.save_error, up.last_error, bool(up.pending or up.snapshot))

    def save_failed(self, step: int, err: BaseException | str) -> None:
        """Count a save that could not be made (reported; checkpoint.max_failed_saves stops the run)."""
        self.uploader.save_failed(step, err)

    def check_space(self, step: int, expected_bytes: int) -> None:
        """Raise when the staging disk has no room for a checkpoint of about ``expected_bytes``."""
        self.staging.check_space(step, expected_bytes)

    def staged_path(self, name: str) -> Path:
        """The folder ``name`` (from :meth:`new_folder`) on this machine's staging disk."""
        return self.staging.folder / name

    def where_staged(self) -> str:
        """Where the newest checkpoint not committed yet lies on this machine (or the staging folder)."""
        staged = self.staging.list()
        return staged[0].uri if staged else str(self.staging.folder)

    def protect(self, step: int) -> None:
        """Retention never deletes the checkpoint of ``step`` (the one this session resumed from)."""
        self.store.protected.add(step)

    def commit_now(self, ckpt: Checkpoint) -> None:
        """Upload the staged ``ckpt`` now, in this thread (raises what the bucket answers)."""
        self.store.upload(Path(ckpt.uri), ckpt.manifest)

    def committed(self) -> list[Checkpoint]:
        """The committed checkpoints, newest first."""
        return self.store.list()

    @property
    def guard(self) -> Callable[[], None] | None:
        """The run's lease check, called before every object written or deleted in the run folder."""
        return self.store.guard

    def delete_everything(self, names: tuple[str, ...]) -> None:
        """--fresh: every staged checkpoint, and ``names`` in the run folder (each delete fenced by the lease)."""
        for ckpt in self.staging.list():
            self.staging.remove(ckpt.step)
        for name in names:
            self.store.writer.delete(storage.join(self.run_uri, name), recursive=True)

    # ------------------------------------------------------------------ loading

    def candidates(self) -> list[Checkpoint]:
        """Staged and committed checkpoints, newest first; at equal step the staged copy first (local), then the
        committed one (tried when the staged copy is damaged: a session killed while it cleaned it up)."""
        found = [(c.step, 1, c) for c in self.store.list()] + [(c.step, 0, c) for c in self.staging.list()]
        return [c for _, _, c in sorted(found, key=lambda t: (-t[0], t[1]))]

    def latest_valid(self, step: int | None = None) -> tuple[Checkpoint, Path] | None:
        """(checkpoint, local folder with verified files) of the newest valid checkpoint or ``step``. A file
        deleted while it is read (retention of a run training beside this reader) makes it list again."""
        for _ in range(3):
            found = [c for c in self.candidates() if step is None or c.step == step]
            if step is not None and not found:
                held = sorted({c.step for c in self.candidates()})
                raise CheckpointError(f"no checkpoint at step {step} in {self.store.root_uri}; it holds "
                                      + (f"steps {', '.join(map(str, held))}" if held else "none yet"))
            damaged: list[str] = []
            try:
                picked = self._first_valid(found, damaged)
            except CheckpointVanished:
                continue
            if picked is not None:
                return picked
            damaged += [f"committed {storage.join(self.store.root_uri, name)} ({why})"
                        for name, why in self.store.unreadable.items()]
            if step is not None:
                raise CheckpointError(f"the checkpoint at step {step} is damaged: {damaged[0]}")
            if damaged:  # starting over at step 0 here would also let retention delete the new checkpoints
                raise CheckpointError(
                    f"none of the {len(damaged)} checkpoint(s) of {self.run_uri} can be loaded: {'; '.join(damaged)}. "
                    "Nothing was deleted. To continue the run, restore the named files (a staged copy may still be "
                    "on the machine that saved it, under $VOXRELAY_CACHE/staging/; re-running `voxrelay train` there "
                    "uploads it); to start over, delete them or run `voxrelay train` with --fresh (it deletes them)"
                )
            return None
        raise CheckpointError(f"the checkpoints of {self.run_uri} keep being deleted while they are read; retry")

    def _first_valid(self, found: list[Checkpoint], damaged: list[str]) -> tuple[Checkpoint, Path] | None:
        for ckpt in found:
            try:
                return self._local_copy(ckpt)
            except CheckpointVanished:
                raise
            except CheckpointIncomplete as err:  # never whole: not damaged, not worth keeping
                log.warning("the staged checkpoint %s cannot be completed (%s); %s, falling back to the previous one",
                            ckpt.uri, err, "left to its trainer" if self.reader else "it is removed")
                if not self.reader:
                    self.staging.remove(ckpt.step)
            except CheckpointError as err:
                where = "committed" if ckpt.durable else "staged"
                damaged.append(f"{where} {ckpt.uri} ({err})")
                log.warning("%s checkpoint %s is damaged (%s); falling back to the previous one", where,
                            ckpt.uri, err)
        return None

    @property
    def fetched_dir(self) -> Path:
        return self.staging.folder / FETCHED_DIR

    def _reader_dir(self) -> Path:
        """A reader's own folder for its copies (never the trainer's ``fetched``); those of dead readers go."""
        base = cache_dir("read", uri_key(self.run_uri))
        for old in base.iterdir():
            pid = old.name.split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True)
        return Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=base))

    def _local_copy(self, ckpt: Checkpoint) -> tuple[Checkpoint, Path]:
        """(the checkpoint, a local folder with its verified files)."""
        if not ckpt.durable:
            folder = Path(ckpt.uri)
            if any(not (folder / name).exists() for name in ckpt.manifest.get(ELSEWHERE, ())):
                if self.reader:  # only the trainer holding the lease commits it
                    raise CheckpointIncomplete("its other machines' shards are not here; it is not committed yet")
                return self._complete(ckpt, folder)
            verify_folder(folder, ckpt.manifest)
            return ckpt, folder
        if self.reader:
            dest = self._reader_dir() / step_name(ckpt.step)
            try:
                return ckpt, self.store.fetch(ckpt, dest)
            except CheckpointError:
                shutil.rmtree(dest.parent, ignore_errors=True)
                raise
        dest = self.fetched_dir / step_name(ckpt.step)
        if self.fetched_dir.exists():  # copies of other steps left by an earlier multi-process session
            for old in self.fetched_dir.iterdir():
                if old != dest:
                    shutil.rmtree(old, ignore_errors=True)
        try:
            return ckpt, self.store.fetch(ckpt, dest)
        except CheckpointError:
            shutil.rmtree(dest, ignore_errors=True)
            raise

    def _complete(self, ckpt: Checkpoint, folder: Path) -> tuple[Checkpoint, Path]:
        """A staged checkpoint of a job over several machines, killed before rank 0 committed it: the shards of
        the other machines' ranks are not here. If they reached the bucket it is committed now and they are
        fetched beside this machine's files; else it can never be whole (CheckpointIncomplete)."""
        verify_folder(folder, ckpt.manifest, skip=set(ckpt.manifest[ELSEWHERE]))
        try:
            committed = self.store.upload(folder, ckpt.manifest, parts_wait_s=0)
        except PartsMissing as err:
            raise CheckpointIncomplete(f"the shards the other machines staged did not all reach the bucket: {err}"
                                       ) from None
        log.info("committed the checkpoint of step %d, staged here and on the job's other machines", ckpt.step)
        return committed, self.store.fetch(committed, folder)

    def open(self, step: int | None = None, mmap: bool = False) -> ResumePoint | None:
        """The :class:`ResumePoint` of the newest valid checkpoint (or ``step``), or None;
        the weights stay in the folder (:func:`voxrelay.checkpoint.reader.read_into` reads them into a built
        model, DCP into a sharded one); :meth:`release` the folder once they are loaded. ``mmap``: the train
        state's tensors stay in the file until used (moved one by one to a GPU, no second copy in memory)."""
        found = self.latest_valid(step)
        if found is None:
            return None
        ckpt, folder = found
        return ResumePoint(ckpt, folder, load_state(folder / STATE_FILE, mmap=mmap,
                                                    where=storage.join(ckpt.uri, STATE_FILE)))

    def load(self, step: int | None = None) -> tuple[Checkpoint, dict[str, torch.Tensor] | Path, dict] | None:
        """(checkpoint, model tensors, train state) of the newest valid checkpoint, or None. For a sharded
        checkpoint the model tensors are the verified local folder that DCP loads from."""
        found = self.open(step)
        if found is None or is_sharded(found.checkpoint.manifest):  # DCP loads it into the sharded model
            return found
        ckpt, folder, state = found
        weights = load_file(str(folder / MODEL_FILE))
        self.release(folder)
        return ckpt, weights, state

    def load_model(self, step: int | None = None) -> tuple[Checkpoint, dict[str, torch.Tensor], dict]:
        """The latest valid checkpoint (or ``step``): its weights and the family's extra state beside them
        (``FamilyState.extra_state``, e.g. an EMA; {} when there is none)."""
        found = self.latest_valid(step)
        if found is None:
            raise CheckpointError(f"no valid checkpoint in {self.store.root_uri}; train first (voxrelay train CONFIG)")
        ckpt, folder = found
        try:
            weights = read_model(folder, ckpt.uri) if is_sharded(ckpt.manifest) else load_file(str(folder / MODEL_FILE))
            family = load_state(folder / STATE_FILE, mmap=True, where=storage.join(ckpt.uri, STATE_FILE))
            family = {name: t.clone() for name, t in (family.get("family") or {}).items()}  # off the file's pages
        finally:  # refused or read: the fetched copy goes
            self.release(folder)
        return ckpt, weights, family

    def release(self, folder: Path) -> None:
        """Remove a fetched copy once it is in memory; never a staged checkpoint (the only copy of
        one not yet uploaded). With several processes it stays for the others (see start())."""
        if self.reader and folder.parent.parent == cache_dir("read", uri_key(self.run_uri)):
            shutil.rmtree(folder.parent, ignore_errors=True)
        elif not self.reader and folder.parent == self.fetched_dir and rank_world()[1] == 1:
            shutil.rmtree(folder, ignore_errors=True)


class CheckpointIncomplete(CheckpointError):
    """A staged checkpoint whose other machines' shards never reached the bucket: it cannot be loaded anywhere."""


def _hashes(ckpt: Checkpoint) -> dict[str, str]:
    return {name: meta["sha256"] for name, meta in ckpt.manifest["files"].items()}
