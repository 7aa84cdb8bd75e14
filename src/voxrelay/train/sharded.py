"""Checkpoints of a ``train.strategy=fsdp`` run: every rank writes its own shards of the model and optimizer
state with torch.distributed.checkpoint (DCP) into one folder on the staging disk; rank 0 adds
``train_state.pt`` (everything that is not a sharded tensor), gathers each rank's file sizes and sha256,
and stages the folder with its manifest for the background upload (manifest.json uploaded last, as for
every checkpoint). Loading reshards to the current number of processes (DCP plans the reads).

The DCP write is synchronous (the training thread waits for the shards to reach local disk; the upload is
in the background): ``dcp.async_save`` would need a second gloo group and a copy of every shard in memory,
while the local write of a shard is short next to its upload.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from voxrelay.checkpoint.manager import STATE_FILE
from voxrelay.checkpoint.sharded import DCP, DCP_METADATA, MODEL_KEY, OPTIM_KEY, SHARDED, rank_files
from voxrelay.checkpoint.store import CheckpointError, sha256_file

log = logging.getLogger(__name__)


def _options(lora: bool) -> StateDictOptions:
    # LoRA: the frozen base is rebuilt from the config, only the trained tensors are saved and loaded
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora)


def _file_meta(path: Path) -> dict:
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def _one(obj):
    """Rank 0's ``obj`` on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def save_sharded(run, state: dict, extra: dict, expected_bytes: int) -> None:
    """Every rank: write this rank's shards of ``run.module`` and ``run.optimizer`` (a collective); rank 0:
    write ``state`` (the train state without the optimizer) and stage the whole folder for upload."""
    rank, main = dist.get_rank(), run.accelerator.is_main_process
    step = run.loop.step
    if main:
        run.checkpoints.staging.check_space(step, expected_bytes)
    # ranks of one machine share the staging disk (the same VOXRELAY_CACHE): rank 0 names the folder
    folder = Path(_one(str(run.checkpoints.new_folder(step)) if main else None))
    model_sd, optim_sd = get_state_dict(run.module, run.optimizer, options=_options(run.base_hash is not None))
    dcp.save({MODEL_KEY: model_sd, OPTIM_KEY: optim_sd}, checkpoint_id=str(folder))
    mine = {p.name: _file_meta(p) for p in rank_files(folder, rank)}  # hashed by every rank, in parallel
    reports: list = [None] * dist.get_world_size()
    dist.all_gather_object(reports, mine)
    if not main:
        return
    torch.save(state, folder / STATE_FILE)
    files = {name: meta for report in reports for name, meta in report.items()}
    missing = [r for r, report in enumerate(reports) if not report or any(not (folder / n).exists() for n in report)]
    if missing:
        raise CheckpointError(
            f"the shards of ranks {missing} are not in {folder} on this machine: their processes run on other "
            "machines. A train.strategy=fsdp run over several machines needs VOXRELAY_CACHE on a filesystem "
            "every machine shares"
        )
    files |= {name: _file_meta(folder / name) for name in (DCP_METADATA, STATE_FILE)}
    run.checkpoints.save_folder(step, folder, files, extra | {SHARDED: DCP})


def load_sharded(run, folder: Path) -> None:
    """The model and optimizer state of the sharded checkpoint in ``folder`` into ``run.module`` and
    ``run.optimizer`` (already sharded; called once the scheduler exists, since loading the optimizer
    sets the learning rate the schedule had reached)."""
    options = _options(run.base_hash is not None)
    model_sd, optim_sd = get_state_dict(run.module, run.optimizer, options=options)
    dcp.load({MODEL_KEY: model_sd, OPTIM_KEY: optim_sd}, checkpoint_id=str(folder))
    set_state_dict(run.module, run.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=options)

