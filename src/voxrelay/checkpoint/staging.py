"""Local staging of checkpoints and their background upload.

Saving writes the checkpoint to local disk (fast: the training thread waits only for this), then
an :class:`Uploader` thread copies it to the run folder and commits it with its manifest. When the
bucket is unreachable (a transient error) the uploader keeps retrying with backoff while training
goes on; staged checkpoints stay on disk (at most ``max_staged``; older ones are superseded by newer
ones). A permanent error (access denied, no such bucket, a bug) is not retried: ``fatal`` says what
it was, waits return at once, and the loop stops with the checkpoint staged.

A checkpoint of a job over several machines whose other machines' parts did not reach the bucket within
``CommittedStore.parts_wait_s`` is abandoned (logged, its staged folder removed): it can never be whole, and
the checkpoints after it commit. ``max_abandoned`` abandoned in a row (nothing committed meanwhile) is fatal.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from voxrelay import storage
from voxrelay.checkpoint.store import (
    ELSEWHERE,
    MANIFEST,
    Checkpoint,
    CheckpointError,
    CommittedStore,
    PartsMissing,
    make_manifest,
    parse_step,
    read_local_manifest,
    step_name,
    verify_folder,
)

log = logging.getLogger(__name__)
Writer = Callable[[Path], None]


class Staging:
    """Staged checkpoints in a local folder; a staged folder exists only once complete."""

    def __init__(self, folder: Path):
        self.folder = folder

    def check_space(self, step: int, expected_bytes: int) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.folder).free
        if expected_bytes and free < expected_bytes * 1.1 + (16 << 20):
            raise CheckpointError(
                f"not enough space to stage the checkpoint of step {step} in {self.folder}: "
                f"{free / 2**20:.0f} MiB free, about {expected_bytes / 2**20:.0f} MiB needed. Free disk space or "
                "point VOXRELAY_CACHE at a bigger disk; committed checkpoints are untouched"
            )

    def stage(self, step: int, writers: dict[str, Writer], extra: dict) -> Checkpoint:
        tmp = self.new_folder(step)
        try:
            for name, write in writers.items():
                write(tmp / name)
                storage.fsync_file(tmp / name)  # on disk before the manifest can exist: a power loss mid-save
            return self.commit(step, tmp, make_manifest(step, tmp, list(writers), extra))  # leaves no manifest
        except BaseException as err:  # any failure (torch, safetensors, a full disk, Ctrl-C): no partial folder
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(err, OSError) and err.errno == errno.ENOSPC:
                raise CheckpointError(
                    f"the staging disk {self.folder} is full while saving step {step}; free space or point "
                    "VOXRELAY_CACHE at a bigger disk. Committed checkpoints are untouched"
                ) from None
            raise

    def new_folder(self, step: int) -> Path:
        """An empty folder to write the files of ``step`` into (e.g. by several processes) before :meth:`commit`."""
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".tmp-{step_name(step)}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        return tmp

    def commit(self, step: int, tmp: Path, manifest: dict) -> Checkpoint:
        """Write ``manifest`` into ``tmp`` (holding its files) and rename it to the staged step folder."""
        (tmp / MANIFEST).write_text(_json(manifest))
        storage.fsync_file(tmp / MANIFEST)
        storage.fsync_file(tmp)
        final = self.folder / step_name(step)
        shutil.rmtree(final, ignore_errors=True)  # a previous session's copy of this step, never uploaded
        os.replace(tmp, final)  # the staging commit
        storage.fsync_file(self.folder)
        return Checkpoint(step, str(final), manifest, durable=False)

    def list(self) -> list[Checkpoint]:
        """Complete staged checkpoints, newest first (read only: `status` may look while training runs)."""
        if not self.folder.exists():
            return []
        out = []
        for path in self.folder.iterdir():
            step = parse_step(path.name)
            manifest = read_local_manifest(path) if step is not None else None
            if manifest is not None:
                out.append(Checkpoint(step, str(path), manifest, durable=False))
        return sorted(out, key=lambda c: c.step, reverse=True)

    def clean(self) -> None:
        """Remove leftovers of saves killed midway (called by the run's own trainer at start)."""
        if self.folder.exists():
            for path in self.folder.glob(".tmp-*"):
                shutil.rmtree(path, ignore_errors=True)

    def remove(self, step: int) -> None:
        """Renamed out of the way first (atomic), then deleted: a process killed midway leaves a ``.tmp-*``
        leftover for :meth:`clean`, never a staged step with some of its files gone."""
        path = self.folder / step_name(step)
        doomed = self.folder / f".tmp-removed-{path.name}-{uuid.uuid4().hex[:8]}"
        try:
            path.rename(doomed)
        except FileNotFoundError:
            return
        shutil.rmtree(doomed, ignore_errors=True)


class Uploader:
    """Background thread: uploads the newest staged checkpoint, retrying until it is committed."""

    def __init__(self, store: CommittedStore, staging: Staging, max_staged: int = 3, max_backoff: float = 30.0,
                 base_backoff: float = 0.5, max_abandoned: int = 3):
        self.store = store
        self.staging = staging
        self.max_staged = max_staged
        self.max_backoff = max_backoff
        self.base_backoff = base_backoff  # seconds before the 1st retry, doubled after each failure
        self.max_abandoned = max_abandoned  # checkpoints in a row whose other machines' parts never arrived
        self.abandoned: list[int] = []  # their steps, since the last commit
        self.pending: list[Checkpoint] = []
        self.snapshots: list[tuple] = []  # (step, writers, extra) to stage in the thread, oldest first
        self.durable_step: int | None = None
        self.last_error: str | None = None
        self.fatal: str | None = None  # a permanent upload error: nothing more is uploaded
        self.failed_saves = 0  # saves in a row that could not be staged (checkpoint.max_failed_saves stops the run)
        self.save_error: str | None = None  # why the last of them failed
        self._trusted: set[int] = set()  # staged by this process: hashed from bytes just written and fsynced
        self._committed_steps: set[int] = set()  # committed by this process
        self._uploading: int | None = None
        self._retaining = False  # a commit's retention is running: wait() waits for it too
        self.uploaded = (0, 0.0)  # (bytes, seconds) of the committed uploads: upload MB/s
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="voxrelay-upload", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, ckpt: Checkpoint, trusted: bool = True) -> None:
        """Upload ``ckpt`` (staged); one not ``trusted`` (a previous session's) is verified in full first."""
        with self._cond:
            if trusted:
                self._trusted.add(ckpt.step)
                self.failed_saves, self.save_error = 0, None
            self.pending.append(ckpt)
            self.pending.sort(key=lambda c: c.step)
            while len(self.pending) > self.max_staged:
                # the oldest one not being uploaded right now, not evaluated if it can; the newest is never dropped
                droppable = [c for c in self.pending[:-1] if c.step != self._uploading]
                fallback = droppable[0] if droppable else next(c for c in self.pending if c.step != self._uploading)
                dropped = next((c for c in droppable if not _evaluated(c)), fallback)
                self.pending.remove(dropped)
                log.warning("upload is behind (bucket unreachable?); dropping staged step %d, newer ones are kept",
                            dropped.step)
                self.staging.remove(dropped.step)
            self._cond.notify_all()

    @property
    def snapshot(self) -> tuple | None:
        """The next snapshot to stage, or None."""
        with self._cond:
            return self.snapshots[0] if self.snapshots else None

    def submit_snapshot(self, step: int, writers: dict[str, Writer], extra: dict) -> None:
        """Stage (write to local disk) in this thread, then upload. ``writers`` must hold copies of
        the state, not live tensors. A plain snapshot not yet staged is replaced by a newer one (its copy of
        the state is memory); an evaluated one is queued: ``keep_best`` may need it (at most ``max_staged``
        of them wait, the worst scored goes first)."""
        with self._cond:
            for old in [s for s in self.snapshots if not _scored(s[2])]:
                log.warning("step %d was not staged yet when step %d arrived; the newer one is staged next",
                            old[0], step)
                self.snapshots.remove(old)
            self.snapshots.append((step, writers, extra))
            while len(self.snapshots) > self.max_staged:  # only evaluated ones are left before the newest
                worst = max(self.snapshots[:-1], key=lambda s: s[2]["metrics"]["eval/loss"])
                log.warning("step %d (evaluated) was not staged yet and %d newer ones wait; a better evaluated one "
                            "is kept, it is dropped", worst[0], len(self.snapshots) - 1)
                self.snapshots.remove(worst)
            self._cond.notify_all()

    def save_failed(self, step: int, err: BaseException | str) -> None:
        """A save that could not be staged (a full disk, a failed write): reported now, counted."""
        with self._cond:
            self.failed_saves += 1
            self.save_error = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
            log.error("could not save the checkpoint of step %d (%s); %d failed save(s) in a row "
                      "(training stops at checkpoint.max_failed_saves)", step, self.save_error, self.failed_saves)

    def backlog(self) -> int:
        """Staged checkpoints waiting for their upload."""
        with self._cond:
            return len(self.pending)

    def holds(self, step: int) -> bool:
        """True when ``step`` is staged, being staged or uploaded, or committed by this session."""
        with self._cond:
            return step in {c.step for c in self.pending} | self._committed_steps | {s[0] for s in self.snapshots} \
                or step == self._uploading

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted is committed; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (self.pending or self.snapshots or self._retaining) and self.fatal is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return self.fatal is None

    def close(self, timeout: float | None = None) -> bool:
        """Wait (up to ``timeout``) for what was submitted, then stop the thread; True if all is committed.
        Closing again answers at once."""
        if self._closing:
            with self._cond:
                return not (self.pending or self.snapshots) and self.fatal is None
        done = self.wait(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=5)
        return done

    def _stage_snapshot(self) -> None:
        with self._cond:
            job = self.snapshots[0]  # stays queued until staged, so wait() keeps waiting
        try:
            ckpt = self.staging.stage(*job)
        except Exception as err:  # e.g. a full staging disk: committed checkpoints are untouched
            ckpt = None
            self.save_failed(job[0], err)
        with self._cond:
            if job in self.snapshots:
                self.snapshots.remove(job)
            if ckpt is not None:
                self.submit(ckpt)
            self._cond.notify_all()

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while (not self.pending and not self.snapshots or self.fatal) and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                staged_first = bool(self.snapshots)
            if staged_first:
                self._stage_snapshot()
                continue
            with self._cond:
                # the newest (older pending ones are superseded by it), but an evaluated one first: its eval
                # metrics are what checkpoint.keep_best keeps, and a newer save must not make it vanish
                ckpt = next((c for c in self.pending if _evaluated(c)), self.pending[-1])
                self._uploading = ckpt.step
            if not self._verified(ckpt):
                continue
            try:
                started = time.monotonic()
                self.store.upload(Path(ckpt.uri), ckpt.manifest)
                size = sum(int(f.get("size", 0)) for f in ckpt.manifest.get("files", {}).values())
                self.uploaded = (self.uploaded[0] + size, self.uploaded[1] + time.monotonic() - started)
            except PartsMissing as err:  # waited parts_wait_s already: retrying would block every later commit
                self._uploading = None
                self.last_error = f"{type(err).__name__}: {err}"
                self._abandon(ckpt, err)
                continue
            except Exception as err:  # keep training while the bucket is away; report and retry
                failures += 1
                self._uploading = None
                self.last_error = f"{type(err).__name__}: {err}"
                if not storage.is_transient(err, io_errors=True):
                    self._give_up(ckpt, err)
                    continue
                delay = min(self.max_backoff, self.base_backoff * 2 ** min(failures - 1, 10))
                log.warning("upload of step %d failed (%s); retrying in %.0fs, training goes on",
                            ckpt.step, self.last_error, delay)
                with self._cond:  # a new snapshot is staged at once: it must not wait in memory for the bucket
                    self._cond.wait_for(lambda: self._closing or bool(self.snapshots), timeout=delay)
                continue
            failures, self.last_error = 0, None
            self._committed(ckpt)

    def _verified(self, ckpt: Checkpoint) -> bool:
        """A previous session's staged checkpoint is re-hashed before upload (a power loss may have left
        a manifest over truncated files); a damaged one is dropped, naming the file."""
        if ckpt.step in self._trusted:
            return True
        folder = Path(ckpt.uri)
        try:  # the shards other machines staged are not here (they upload them): their sha256 is checked on load
            verify_folder(folder, ckpt.manifest, skip={n for n in ckpt.manifest.get(ELSEWHERE, ())
                                                       if not (folder / n).exists()})
        except CheckpointError as err:
            log.error("the staged checkpoint %s is damaged (%s); it is not uploaded and is removed", ckpt.uri, err)
            with self._cond:
                self.pending = [c for c in self.pending if c.step != ckpt.step]
                self._uploading = None
                self.staging.remove(ckpt.step)
                self._cond.notify_all()
            return False
        self._trusted.add(ckpt.step)
        return True

    def _superseded(self, ckpt: Checkpoint) -> bool:
        """An older staged checkpoint not worth uploading once a newer one is committed: retention would delete it
        (``keep_last`` newer ones committed by this session, not a ``keep_every`` step, not evaluated)."""
        keep_every = self.store.keep_every
        newer = sum(1 for s in self._committed_steps if s > ckpt.step)
        return newer >= self.store.keep_last and not (keep_every and ckpt.step % keep_every == 0) \
            and not _evaluated(ckpt)

    def _abandon(self, ckpt: Checkpoint, err: PartsMissing) -> None:
        """Drop a checkpoint that can never be whole; too many in a row is fatal (training would go on with
        nothing committed)."""
        with self._cond:
            self.pending = [c for c in self.pending if c.step != ckpt.step]
            self.staging.remove(ckpt.step)
            self.abandoned.append(ckpt.step)
            log.error("the checkpoint of step %d is abandoned: %s. Later checkpoints are committed without it",
                      ckpt.step, err)
            if len(self.abandoned) >= self.max_abandoned:
                self.fatal = (f"the checkpoints of steps {', '.join(map(str, self.abandoned))} were abandoned: the "
                              "shards the job's other machines staged never reached the bucket (see their logs for "
                              f"the failed uploads); nothing was committed after step {self.durable_step}. {err}")
            self._cond.notify_all()

    def _give_up(self, ckpt: Checkpoint, err: Exception) -> None:
        with self._cond:
            self.fatal = f"{type(err).__name__}: {err}"
            self._cond.notify_all()
        log.error("upload of step %d failed for good (%s); not retrying. The checkpoint stays staged at %s",
                  ckpt.step, self.fatal, ckpt.uri)

    def _committed(self, ckpt: Checkpoint) -> None:
        with self._cond:
            self.durable_step = max(ckpt.step, self.durable_step if self.durable_step is not None else -1)
            self._committed_steps.add(ckpt.step)
            self.abandoned = []
            done = [c for c in self.pending if c.step == ckpt.step or c.step < ckpt.step and self._superseded(c)]
            self.pending = [c for c in self.pending if c not in done]
            self._uploading = None
            for c in done:
                self.staging.remove(c.step)
            self._retaining = True
            pending = {c.step for c in self.pending}  # their parts other machines uploaded are no leftovers
            self._cond.notify_all()
        try:
            self.store.retain(pending)
        except Exception as err:
            log.warning("retention after step %d failed (%s); will retry after the next save", ckpt.step, err)
        finally:
            with self._cond:
                self._retaining = False
                self._cond.notify_all()


def _evaluated(ckpt: Checkpoint) -> bool:
    """A checkpoint saved with eval metrics (retention's keep_best compares them)."""
    return "eval/loss" in ckpt.metrics


def _scored(extra: dict) -> bool:
    """A snapshot's ``extra`` holds eval metrics (see :func:`_evaluated`)."""
    return "eval/loss" in (extra.get("metrics") or {})


def _json(obj: dict) -> str:
    import json

    return json.dumps(obj, indent=2, sort_keys=True)
