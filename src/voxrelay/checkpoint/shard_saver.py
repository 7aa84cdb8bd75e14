"""Saving and loading the sharded checkpoints of a ``train.strategy=fsdp`` run (their files:
:mod:`voxrelay.checkpoint.sharded`). Every rank writes its own shards of the model and optimizer state with
torch.distributed.checkpoint (DCP) into one folder on the staging disk; rank 0 adds ``train_state.pt``
(everything that is not a sharded tensor), gathers each rank's file sizes and sha256, and stages the folder with
its manifest for the background upload (manifest.json uploaded last, as for every checkpoint). Loading reshards
to the current number of processes (DCP plans the reads).

The DCP write is asynchronous (:class:`ShardSaver`): ``dcp.async_save`` copies this rank's shards into CPU
memory before it returns (its default stager, synchronous: the training thread may change the weights as
soon as it returns, the copy is the state of the save's step), then a thread writes them. A second thread
waits for that write and, on the saver's own gloo group, hashes, gathers the file lists and hands the folder
to the checkpoint manager, so the checkpoint is staged as soon as every rank has written, with no collective of
the training thread in between. Until then the folder has no manifest: a kill leaves a ``.tmp-*`` folder that
loading ignores and the next session removes. A new save, and a final or emergency save (which writes
synchronously), first wait for the previous one.

A job over several machines needs no shared disk: each machine writes the folder on its own staging disk, the
ranks whose shards rank 0 cannot see upload them themselves (then remove them), and rank 0's manifest lists
them as ``elsewhere``: its upload commits once they are all in the bucket (see ``CommittedStore.upload``).
"""

from __future__ import annotations

import logging
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.distributed as dist

from voxrelay import storage
from voxrelay.checkpoint.format import DCP, DCP_METADATA, SHARDED, STATE_FILE
from voxrelay.checkpoint.sharded import MODEL_KEY, OPTIM_KEY, rank_files
from voxrelay.checkpoint.store import ELSEWHERE, CheckpointError, sha256_file

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    from voxrelay.checkpoint.manager import CheckpointManager
    from voxrelay.train.ranks import Ranks

log = logging.getLogger(__name__)


class Shards(NamedTuple):
    """What a sharded save writes and a sharded load fills: this rank's part of the (FSDP-sharded) ``module`` and
    its ``optimizer``; ``partial``: some part is frozen (LoRA, a frozen encoder) and rebuilt from the config, so
    only the trained tensors are saved and loaded; ``ranks``: the job's processes (their gloo group)."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    partial: bool
    ranks: Ranks


def _options(partial: bool) -> StateDictOptions:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=partial, strict=not partial)


def _state_dicts(shards: Shards) -> tuple[dict, dict]:
    """DCP's model and optimizer state dicts; with frozen parts, none of their tensors (DCP's
    ``ignore_frozen_params`` keeps the second name of a tied frozen weight, e.g. T5's embed_tokens)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(shards.module, shards.optimizer, options=_options(shards.partial))
    if shards.partial:
        frozen = {name for name, p in shards.module.named_parameters(remove_duplicate=False) if not p.requires_grad}
        model_sd = {k: v for k, v in model_sd.items() if k not in frozen}
    return model_sd, optim_sd


def _file_meta(path: Path) -> dict:
    storage.fsync_file(path)  # DCP wrote it: on disk before the manifest can exist
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


class _Save(NamedTuple):
    """One save, as every step of it needs it."""

    shards: Shards
    checkpoints: CheckpointManager
    step: int
    folder: Path
    extra: dict

    def failed(self, err: BaseException | None) -> None:
        """Report ``err`` (None: nothing failed): rank 0 counts it (``checkpoint.max_failed_saves``), others log."""
        if err is None:
            return
        if self.shards.ranks.main:
            self.checkpoints.save_failed(self.step, err)
        else:
            log.error("this rank could not save its shards of step %d: %s: %s", self.step, type(err).__name__, err)


class ShardSaver:
    """The sharded saves of one run (one per process): at most one in flight at a time.

    ``group``: a gloo process group of its own for DCP's collectives and the gather of file lists in the
    background (made at the first save, a collective every rank reaches there; DCP's async save aborts on
    the default group, and on GPUs that one is NCCL)."""

    WAIT_S = 1800.0  # the longest a save may take (write, hash, gather, stage) before :meth:`wait` gives up

    def __init__(self):
        self.group = None
        self.pending: Future | None = None  # the in-flight save: write, hash, gather, stage
        self._thread: ThreadPoolExecutor | None = None

    def save(self, shards: Shards, checkpoints: CheckpointManager, step: int, state: dict, extra: dict,
             expected_bytes: int, background: bool = True) -> None:
        """Every rank: start writing this rank's shards (a collective); rank 0 writes ``state`` (the train state
        without the optimizer) now and stages the folder with ``extra`` in its manifest once every rank's shards
        are on disk. ``background=False``: staged before it returns. A failure (no room, a failed write on any
        rank) is reported and counted on rank 0 (``checkpoint.max_failed_saves``), not raised."""
        import torch.distributed.checkpoint as dcp

        self.wait()
        name = shards.ranks.broadcast(_new_folder(checkpoints, step, state, expected_bytes) if shards.ranks.main
                                      else None)
        if name is None:
            return
        save = _Save(shards, checkpoints, step, checkpoints.staged_path(name), extra)
        tensors = _agreed_shards(save)
        if tensors is None:
            return
        if not background:  # last or emergency save: no copy in memory, the write is what we wait for
            try:
                dcp.save(tensors, checkpoint_id=str(save.folder), process_group=shards.ranks.group)
                _stage(save, shards.ranks.group)
            except Exception as err:  # DCP and _stage raise on every rank alike: all go on in step
                save.failed(err)
                shutil.rmtree(save.folder, ignore_errors=True)  # no partial folder left (on each machine's disk)
            return
        if self.group is None:
            self.group = dist.new_group(backend="gloo")
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="voxrelay-shards")
        written = dcp.async_save(tensors, checkpoint_id=str(save.folder), process_group=self.group)
        self.pending = self._thread.submit(_finish, written, save, self.group)
        # reported as soon as it fails (not at the next save, which may be hours later or the emergency one)
        self.pending.add_done_callback(lambda done: save.failed(done.exception()))

    def wait(self) -> None:
        """Block until the save in flight is staged or failed (every rank calls it at the same point). Its
        failure was reported when it happened and does not stop the next save (e.g. the emergency one)."""
        pending, self.pending = self.pending, None
        if pending is not None and futures_wait([pending], timeout=self.WAIT_S).not_done:
            raise TimeoutError(f"the sharded save in flight has not finished after {self.WAIT_S:.0f} s (a hung "
                               "disk, or a rank stuck before the save's collectives); stopping rather than "
                               "waiting forever: look for the rank that logged an error or stopped logging")


def _new_folder(checkpoints: CheckpointManager, step: int, state: dict, expected_bytes: int) -> str | None:
    """Rank 0: the name of a new folder on the staging disk holding ``state`` (small: written now, before the live
    objects change), or None when it cannot be made (no room, an unwritable staging disk: reported and counted).
    Each machine has the folder on its own staging disk (VOXRELAY_CACHE), which its processes share."""
    made = None
    try:
        checkpoints.check_space(step, expected_bytes)
        made = checkpoints.new_folder(step)
        torch.save(state, made / STATE_FILE)
        return made.name
    except Exception as err:  # noqa: BLE001 (reported and counted)
        checkpoints.save_failed(step, err)
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        return None


def _agreed_shards(save: _Save) -> dict | None:
    """Every rank: its folder (on another machine's disk: not made yet) and its DCP state dicts, or None on every
    rank when any rank could not make them (a full staging disk, out of memory copying its state): agreed on
    before DCP's collectives, which a rank that raised here would leave the others waiting in."""
    tensors, error = None, None
    try:
        save.folder.mkdir(parents=True, exist_ok=True)
        model_sd, optim_sd = _state_dicts(save.shards)
        tensors = {MODEL_KEY: model_sd, OPTIM_KEY: optim_sd}
    except Exception as err:  # noqa: BLE001 (agreed on below, reported and counted on rank 0)
        error = f"{type(err).__name__}: {err}"
    failed = {r: why for r, why in enumerate(save.shards.ranks.gather(error)) if why}
    if not failed:
        return tensors
    save.failed(CheckpointError(f"the sharded checkpoint of step {save.step} was not written: {failed} "
                                "(rank: error)"))
    shutil.rmtree(save.folder, ignore_errors=True)
    return None


def _finish(written: Future, save: _Save, group) -> None:
    """In the saver's thread of every rank: wait for this rank's DCP write, then stage (see :func:`_stage`)."""
    try:
        written.result()
    except Exception as err:  # DCP reports a failed write to every rank: each still joins the gather
        error = f"{type(err).__name__}: {err}"
    else:
        error = None
    _stage(save, group, error)


def _stage(save: _Save, group, error: str | None = None) -> None:
    """Every rank hashes its own files (in parallel) and gathers the lists on ``group``; rank 0 stages the
    folder with its manifest. Raises on every rank if any rank's write failed."""
    ranks, folder = save.shards.ranks.over(group), save.folder
    mine: dict | str
    try:
        mine = error or {p.name: _file_meta(p) for p in rank_files(folder, ranks.rank)}
    except OSError as err:
        mine = f"{type(err).__name__}: {err}"
    reports = ranks.gather(mine)
    failed = {r: report for r, report in enumerate(reports) if isinstance(report, str)}
    if failed:
        shutil.rmtree(folder, ignore_errors=True)  # every rank: some may be alone on their machine's disk
        raise CheckpointError(f"the sharded checkpoint of step {save.step} was not written: {failed} (rank: error)")
    files = {name: meta for report in reports for name, meta in report.items()}
    # the shards rank 0 cannot see were written on other machines' disks: each of their ranks uploads its own
    elsewhere = ranks.broadcast(sorted(n for n in files if not (folder / n).exists()) if ranks.main else None)
    if not ranks.main:
        if set(mine) & set(elsewhere):
            save.checkpoints.upload_part(save.step, folder, mine)  # with the sha256 rank 0's manifest holds
        return
    files |= {name: _file_meta(folder / name) for name in (DCP_METADATA, STATE_FILE)}
    save.checkpoints.save_folder(save.step, folder, files, save.extra | {SHARDED: DCP} |
                                 ({ELSEWHERE: elsewhere} if elsewhere else {}))


def load_sharded(shards: Shards, folder: Path, where: str | None = None) -> None:
    """The model and optimizer state of the sharded checkpoint in ``folder`` into ``shards.module`` and
    ``shards.optimizer`` (already sharded; called once the scheduler exists, since loading the optimizer sets the
    learning rate the schedule had reached). ``where``: the checkpoint's URI, for errors."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from voxrelay.checkpoint import safe_dcp

    model_sd, optim_sd = _state_dicts(shards)
    safe_dcp.load({MODEL_KEY: model_sd, OPTIM_KEY: optim_sd}, folder, process_group=shards.ranks.group, where=where)
    set_state_dict(shards.module, shards.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                   options=_options(shards.partial))
