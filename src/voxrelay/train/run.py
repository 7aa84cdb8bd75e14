"""A built training session (:class:`Run`): what :mod:`voxrelay.train.build` makes and the loop steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator

from voxrelay.checkpoint.lease import RunLease
from voxrelay.checkpoint.manager import CheckpointManager
from voxrelay.checkpoint.shard_saver import Shards, ShardSaver
from voxrelay.codecs.base import AudioCodec
from voxrelay.config import RunConfig
from voxrelay.cost.usage import UsageLog
from voxrelay.data.loader import BatchStream
from voxrelay.models.base import FamilyModel
from voxrelay.monitor.sinks import Monitor
from voxrelay.quality.scorer import Scorer
from voxrelay.train import state as st
from voxrelay.train.ranks import Ranks
from voxrelay.train.strategies import trainable_state


@dataclass(kw_only=True)
class Run:
    """A training session's parts, built by :func:`build_run` (every field) or :func:`bare_run` (a model to step,
    with no data, checkpoints or monitor: those stay None)."""

    cfg: RunConfig
    accelerator: Accelerator
    model: FamilyModel
    module: torch.nn.Module  # model.module, wrapped by accelerate (DDP, precision) or sharded (FSDP2)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    stream: BatchStream | None = None
    eval_rows: list = field(default_factory=list)
    codec: AudioCodec | None = None
    checkpoints: CheckpointManager | None = None
    monitor: Monitor | None = None
    loop: st.LoopState = field(default_factory=st.LoopState)
    local_dir: Path | None = None
    data_fingerprint: dict | str = ""
    resumed_from: int | None = None
    base_hash: str | None = None  # some part frozen (LoRA, a frozen encoder): the model as built (strategies.base_hash)
    sharded: bool = False  # train.strategy=fsdp: each rank holds part of the weights (a forward needs every rank)
    index: dict | None = None  # the prepared data's index.json (the memory plan behind the advice at an OOM)
    shard_saver: ShardSaver = field(default_factory=ShardSaver)  # fsdp: the asynchronous DCP saves
    scorer: Scorer | None = None  # WER/CER and speaker similarity of eval samples (rank 0; loads on first use)
    ranks: Ranks = field(default_factory=lambda: Ranks(None, 0, 1))  # the processes agreeing on CPU-side values
    lease: RunLease | None = None  # rank 0: this session's hold on the run folder (voxrelay.checkpoint.lease)
    usage: UsageLog | None = None  # this session's GPU time and storage requests, and cost.budget (voxrelay.cost)

    def model_state(self) -> dict[str, torch.Tensor]:
        """What a checkpoint holds: every weight, or when some part is frozen (LoRA, a frozen encoder) the
        trained tensors only (the frozen parts are rebuilt from the config and checked against ``base_hash``)."""
        module = self.accelerator.unwrap_model(self.module)
        return module.state_dict() if self.base_hash is None else trainable_state(module)

    def shards(self) -> Shards:
        """What a sharded (fsdp) save writes and a sharded load fills on this rank."""
        return Shards(self.module, self.optimizer, self.base_hash is not None, self.ranks)

    def close(self, upload_timeout: float) -> bool:
        """Stop what :func:`build_run` started: the threads building batches and fetching shards, the checkpoint
        manager (the last checkpoint still uploads, for at most ``upload_timeout`` s; a no-op once closed) and the
        lease's renewals (released). :func:`voxrelay.train.loop.train` calls it however it ends; a caller that
        builds a run to step it by hand calls it too. False: the last checkpoint did not become durable."""
        if self.stream is not None:
            self.stream.close()
        durable = True
        if self.checkpoints is not None and self.accelerator.is_main_process:
            durable = self.checkpoints.close(upload_timeout)
        if self.lease is not None:
            self.lease.release()
        return durable

    def exit(self, code: int) -> None:
        """End the process once everything is committed and every rank is done: under torch.distributed,
        exit-time destructors of gloo's threads can abort it ("terminate called without an active
        exception", SIGABRT) after a successful run, so streams are flushed and the interpreter's
        finalization is skipped."""
        import logging
        import os
        import sys

        self.accelerator.wait_for_everyone()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        if self.accelerator.num_processes > 1:
            os._exit(code)
