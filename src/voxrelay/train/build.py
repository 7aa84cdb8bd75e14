"""Builds everything a run needs before the loop starts: data, model, optimizer, schedule,
accelerator, checkpoint manager and monitor, and restores the latest checkpoint.

The loop then receives built objects (:class:`Run`) and never mentions a backend or family.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import AutocastKwargs

from voxrelay import storage
from voxrelay.checkpoint.fence import Guard, job_guard
from voxrelay.checkpoint.lease import RunLease, check_root_for_leases
from voxrelay.checkpoint.manager import CheckpointManager, ResumePoint
from voxrelay.checkpoint.sharded import is_sharded
from voxrelay.config import RunConfig, TrainConfig, with_added_defaults
from voxrelay.cost.usage import UsageLog
from voxrelay.data.identity import fingerprint
from voxrelay.data.prepare import load_index
from voxrelay.models import hub_cache
from voxrelay.models.base import FamilyModel
from voxrelay.models.lora_config import LoraConfig
from voxrelay.models.qlora import compute_dtype
from voxrelay.models.registry import codec_for_run, get_family, model_for_run
from voxrelay.monitor.sinks import TB_DIR, WANDB_RUN_FILE, build_monitor
from voxrelay.paths import CKPT_DIR, CONFIG_SNAPSHOT, METRICS_FILE, USAGE_FILE, cache_dir, uri_key
from voxrelay.plan.fit import check_fits, gpu_memory
from voxrelay.precision import settle as settle_precision
from voxrelay.quality.scorer import Scorer
from voxrelay.storage.mounts import root_mount
from voxrelay.train import state as st
from voxrelay.train.data import build_stream, check_same_codec, check_trainable, eval_split, packing
from voxrelay.train.evaluate import SAMPLES_DIR
from voxrelay.train.launch_env import apply_accelerate_env, launched_rank, one_voice_per_job
from voxrelay.train.optim import build_optimizer, build_scheduler, check_available, started_schedule
from voxrelay.train.optim import lr_lambda as lr_lambda  # re-exported: bench/loop_overhead.py imports it here
from voxrelay.train.ranks import Ranks
from voxrelay.train.resume import check_compatible, load_weights, restore
from voxrelay.train.run import Run
from voxrelay.train.strategies import (
    apply_fsdp,
    apply_lora,
    base_hash,
    choose_loss,
    fsdp_mesh,
    has_frozen,
    layer_options,
)

log = logging.getLogger(__name__)


def optimizer_groups(model: FamilyModel, tc: TrainConfig) -> list[dict]:
    """The family's groups (which parameters train, which decay), or with ``train.decay_norms_and_biases``
    one group of every trainable parameter in module order: exactly the optimizer voxrelay built before
    the groups existed (the demo keeps it, so its numbers stay those it always gave)."""
    if tc.decay_norms_and_biases:
        return [{"params": [p for p in model.module.parameters() if p.requires_grad], "weight_decay": tc.weight_decay}]
    return model.param_groups(tc.weight_decay)


def _example_lengths(model: FamilyModel, rows: list) -> tuple[list[int], list[int]]:
    """Length of every row's example; rows longer than the model's max_length are left out (with a warning)."""
    keep, lengths, dropped = [], [], []
    for i, r in enumerate(rows):
        n = model.length(r)
        if n > model.max_length:
            dropped.append(f"{r.id} ({n} tokens)")
            continue
        keep.append(i)
        lengths.append(n)
    if dropped:
        log.warning("%d rows longer than %s=%d are left out of training (raise it to keep them): %s",
                    len(dropped), model.max_length_key, model.max_length, ", ".join(dropped[:5]))
    return keep, lengths


def local_run_dir(run_uri: str) -> Path:
    """Where metrics are written locally: the run folder itself for a local root."""
    if storage.is_local(run_uri):
        path = Path(storage.local_path(run_uri))
        path.mkdir(parents=True, exist_ok=True)
        return path
    return cache_dir("runs", uri_key(run_uri))


def build_run(cfg: RunConfig, fresh: bool = False, take_over: bool = False) -> Run:
    """Everything a run needs, its lease taken (``take_over``: from a live holder too) and its latest
    valid checkpoint restored (none with ``fresh``: the run's checkpoints and metrics are deleted)."""
    one_voice_per_job()  # launch-time lines once per job, not once per process
    cfg = apply_accelerate_env(cfg)  # `accelerate launch`: its precision, FSDP settings, before anything records cfg
    cfg = settle_precision(cfg, fresh, say=launched_rank() == 0)  # auto: this card's, or what the run recorded
    accelerator = new_accelerator(cfg.train.precision)
    # a collective: every process, at once; its exchanges outwait rank 0's bounded waits (the last upload,
    # a take-over's wait for the old lease)
    ck = cfg.checkpoint
    ranks = Ranks.of_job(max(1800.0, ck.final_upload_timeout + 300, ck.lease_seconds + 300))
    storage.check_root(cfg.root)
    lease = take_lease(cfg, ranks, take_over)  # before anything is written to the run folder, --fresh included
    try:
        guard = job_guard(ranks, lease, cfg.run_uri)  # rank 0's token: the other machines' writes are fenced too
        return _build(cfg, accelerator, ranks, lease, fresh, guard)
    except BaseException:
        if lease is not None:
            lease.release()
        raise


def take_lease(cfg: RunConfig, ranks: Ranks, take_over: bool) -> RunLease | None:
    """Rank 0 takes the run's lease (see :mod:`voxrelay.checkpoint.lease`) and renews it from now on (building
    the run may take longer than the lease: weights, a big checkpoint to fetch); a refusal stops every rank."""
    lease = RunLease(cfg.run_uri, cfg.checkpoint.lease_seconds) if ranks.main else None

    def acquire() -> None:
        unsafe = check_root_for_leases(cfg.root, root_mount(cfg.root), cfg.checkpoint.single_machine)
        if unsafe:
            log.warning(unsafe)
        taken = lease.acquire(take_over)
        if taken:
            log.warning(taken)
        lease.start_renewing()

    ranks.on_main(acquire)
    return lease


def _build(cfg: RunConfig, accelerator: Accelerator, ranks: Ranks, lease: RunLease | None, fresh: bool,
           guard: Guard | None) -> Run:
    rank, world = accelerator.process_index, accelerator.num_processes
    check_available(cfg.train)  # a missing optional package, before data and weights are loaded
    usage = UsageLog.start(cfg.run_uri, cfg.cost, world, ranks.main, fresh, lease.check if lease else None)
    ranks.on_main(usage.check_budget)  # cost.budget spent: refused before weights and data are loaded
    ranks.on_main(usage.heartbeat)  # this session counts from now on, even if it dies before its first save
    index = load_index(cfg.prepared_uri)
    check_trainable(cfg.prepared_uri, index)
    ck = cfg.checkpoint
    checkpoints = CheckpointManager(cfg.run_uri, ck.keep_last, ck.keep_every, ck.keep_best, ck.max_staged,
                                    guard=guard)
    found = None if fresh else _load_latest(checkpoints, accelerator, ranks)
    accelerator.wait_for_everyone()  # every rank has read a shared fetched copy before rank 0 cleans it up
    if found is None:  # a new run (before --fresh deletes anything; a resumed one is compared with its checkpoint)
        check_same_codec(cfg, index)
    if fresh and accelerator.is_main_process:
        lease.check()  # still ours (a lease taken over meanwhile must not lose its run)
        start_over(cfg.run_uri, checkpoints)
    accelerator.wait_for_everyone()
    if found is not None:  # before the model is built: a default that changed may say how (model.weights_dtype)
        keep_started(cfg, found.state[st.K_CONFIG], accelerator.is_main_process)
    check_fits(cfg, index, world, gpu_memory())  # on a GPU: stop now, with the plan, if it will not fit
    hub_cache.from_bucket(cfg, accelerator.is_local_main_process, accelerator.wait_for_everyone)
    codec = codec_for_run(cfg, index)
    eval_rows = eval_split(cfg, index)
    st.seed_everything(cfg.train.seed)
    # train_rows: None (streamed from the shards), unless the family's examples draw on other rows
    model, train_rows = model_for_run(cfg, index, codec)
    packed = packing(model, cfg)
    if packed:
        attention = model.enable_packing(accelerator.device.type, accelerator.mixed_precision in ("bf16", "fp16"))
        if accelerator.is_main_process:
            log.info("packed batches (train.packing): attention kept within each example by %s", attention)
    if accelerator.is_main_process:
        hub_cache.to_bucket(cfg)  # what this session fetched from the hub, for the next sessions
    st.seed_generators(model.generators(), cfg.train.seed, rank)  # the family's own (restored on resume)
    # frozen parts (a LoRA base, a frozen text encoder) are rebuilt from their source, never checkpointed
    base = base_hash(model.module) if cfg.train.lora is not None or has_frozen(model.module) else None
    # its init draws from the RNG seeded above: fresh runs stay reproducible; QLoRA quantises the base after it
    apply_lora(model, cfg.train.lora, compute_dtype(accelerator.mixed_precision))
    layer_options(model, cfg.train, accelerator.device.type)
    eval_rows = [eval_rows[i] for i in _example_lengths(model, eval_rows)[0]]
    if found is not None:
        check_compatible(found.state, cfg, index, found.checkpoint.step,
                         len({c.step for c in checkpoints.candidates()}), model.packing_refusal is None)
        load_weights(model, found, cfg, base, len({c.step for c in checkpoints.candidates()}))
        if not is_sharded(found.checkpoint.manifest):  # the weights are in the model (a sharded one loads in restore)
            checkpoints.release(found.folder)
    choose_loss(model, cfg.train, accelerator.device.type)  # after resume: a resumed run keeps its saved choice
    model.module.train()  # from_pretrained (model.init_from) returns eval mode: dropout would be off
    module, optimizer = wrap_model(model, cfg, accelerator)
    scheduler = build_scheduler(cfg.train, optimizer)
    stream = build_stream(model, cfg, index, rank, world, ranks, train_rows, packed)
    run_dir = local_run_dir(cfg.run_uri)
    run = Run(
        cfg=cfg, accelerator=accelerator, model=model, module=module, optimizer=optimizer, scheduler=scheduler,
        stream=stream, eval_rows=eval_rows, codec=codec, checkpoints=checkpoints,
        monitor=build_monitor(cfg, cfg.run_uri, run_dir, accelerator.is_main_process, checkpoints.guard),
        local_dir=run_dir, data_fingerprint=fingerprint(index), base_hash=base, sharded=cfg.train.strategy == "fsdp",
        index=index, scorer=Scorer(cfg.eval, torch.get_num_threads()) if accelerator.is_main_process else None,
        ranks=ranks, lease=lease, usage=usage,
    )
    if found is not None:
        restore(run, found)
        run.resumed_from = found.checkpoint.step
        checkpoints.protect(found.checkpoint.step)  # retention never deletes what this session resumed from
    accelerator.wait_for_everyone()  # every rank has read the shards before rank 0's start() cleans them up
    if accelerator.is_main_process:
        lease.check()
        storage.write_text(storage.join(cfg.run_uri, CONFIG_SNAPSHOT), cfg.to_yaml())
        checkpoints.start()
    elif accelerator.is_local_main_process:  # another machine of the job: its own staging disk
        checkpoints.tidy_local()
    return run


def keep_started(cfg: RunConfig, saved: dict, main: bool) -> None:
    """A run saved before a default changed goes on as it started (said once): its schedule (see
    :func:`~voxrelay.train.optim.started_schedule`), its model's changed defaults (a family config's
    ``CHANGED_DEFAULTS``: model.weights_dtype float32) and its LoRA's added keys (``LoraConfig``'s
    ``ADDED_WITH_NEW_BEHAVIOUR``: train.lora.embeddings full), each where this session's config leaves it unset."""
    old = with_added_defaults(saved)
    kept = {f"train.{k}": v for k, v in started_schedule(cfg.train, saved).items()}
    if kept:
        cfg.train = cfg.train.model_copy(update={k.removeprefix("train."): v for k, v in kept.items()})
    model = _unset_and_different(cfg.model, old.get("model"), type(cfg.model).CHANGED_DEFAULTS)
    if model and (old.get("model") or {}).get("family") == cfg.model.family:
        cfg.model = cfg.model.model_copy(update=model)
        kept |= {f"model.{k}": v for k, v in model.items()}
    lora = _unset_and_different(cfg.train.lora, (old.get("train") or {}).get("lora"),
                                LoraConfig.ADDED_WITH_NEW_BEHAVIOUR)
    if lora:
        cfg.train.lora = cfg.train.lora.model_copy(update=lora)
        kept |= {f"train.lora.{k}": v for k, v in lora.items()}
    if kept and main:
        log.info("resuming with what this run started with where a default changed since: %s (set them in the "
                 "config to change them)", ", ".join(f"{k}={v}" for k, v in kept.items()))


def _unset_and_different(section, saved: dict | None, keys: dict) -> dict:
    """The saved values of ``keys`` that ``section`` (this session's) leaves unset and that differ from its own."""
    if section is None or not isinstance(saved, dict):
        return {}
    return {k: saved[k] for k in keys
            if k in saved and k not in section.model_fields_set and saved[k] != getattr(section, k)}


def bare_run(model: FamilyModel, cfg: RunConfig, accelerator: Accelerator) -> Run:
    """A :class:`Run` of ``model`` trained as ``voxrelay train`` trains it (train.lora, gradient checkpointing,
    DDP or FSDP2 and the optimizer by the same code) with no data, checkpoints or monitor: what benches and
    memory measurements step with ``train_step``. The caller has seeded the RNG."""
    apply_lora(model, cfg.train.lora, compute_dtype(accelerator.mixed_precision))
    layer_options(model, cfg.train, accelerator.device.type)
    choose_loss(model, cfg.train, accelerator.device.type)
    model.module.train()
    module, optimizer = wrap_model(model, cfg, accelerator)
    return Run(cfg=cfg, accelerator=accelerator, model=model, module=module, optimizer=optimizer,
               scheduler=build_scheduler(cfg.train, optimizer))


def new_accelerator(precision: str) -> Accelerator:
    """This run's Accelerator. accelerate keeps one state per process and refuses a second precision in it: a
    process that trained before (a notebook's second run, in-process tests) in another precision starts afresh.
    cpu=True on a CPU-only machine makes accelerate use gloo DDP under torchrun (else it runs alone); no
    torch.compile whatever ACCELERATE_DYNAMO_BACKEND says (named as not applied at launch)."""
    from accelerate.state import AcceleratorState

    shared = AcceleratorState._shared_state
    if shared and shared.get("_mixed_precision", precision) != precision:
        AcceleratorState._reset_state()
    return Accelerator(mixed_precision=precision, cpu=not torch.cuda.is_available(), dynamo_backend="no")


def wrap_model(model: FamilyModel, cfg: RunConfig, accelerator: Accelerator):
    """(module, optimizer) as the loop trains them. ddp: accelerate wraps the module (DDP when there are
    several processes). fsdp: our FSDP2 sharding, and accelerate does not wrap it (no DDP on top); the
    optimizer is built after sharding, over the sharded (DTensor) parameters.

    Autocast without its weight cache (here and in ``accelerator.autocast()``, which read the same handler): the
    cache keeps a bf16 copy of every fp32 weight a matmul met until the forward's region ends, so at the loss
    every layer's copy would be alive even under checkpointing (measured: tests/helpers/peak.py's autocast rows);
    each weight is cast once per forward anyway, and the cast is the same bits."""
    if accelerator.autocast_handler is None:
        accelerator.autocast_handler = AutocastKwargs(cache_enabled=False)
    tc = cfg.train
    if tc.strategy == "fsdp":
        mesh = fsdp_mesh(tc.fsdp_sharding, accelerator.device.type)
        model.module = apply_fsdp(model.module.to(accelerator.device), model.fsdp_layer_classes(), tc.fsdp_sharding,
                                  tc.precision, tc.cpu_offload, mesh,
                                  get_family(model.family).fsdp_forward_methods)
        return model.module, build_optimizer(tc, optimizer_groups(model, tc))
    return accelerator.prepare(model.module, build_optimizer(tc, optimizer_groups(model, tc)))


def _load_latest(checkpoints: CheckpointManager, accelerator: Accelerator, ranks: Ranks) -> ResumePoint | None:
    """Rank 0 picks the newest valid checkpoint; every rank loads that one (rank 0's error, e.g. every
    checkpoint damaged, stops every rank). On a GPU the optimizer state stays in the file until each
    tensor moves to the device."""
    found = None

    def pick() -> int | None:
        nonlocal found
        found = checkpoints.open(mmap=torch.cuda.is_available())
        if found is not None and not found.checkpoint.durable and spans_machines(accelerator.num_processes):
            found = commit_before_others_look(checkpoints, found)
        return found.checkpoint.step if found else None

    step = ranks.on_main(pick)
    if step is None:
        return found
    # the first process of each machine fetches (one download per machine), then the others read its copy
    first = accelerator.is_local_main_process and not ranks.main
    for here in (first, not (ranks.main or first)):
        found = ranks.each(lambda: checkpoints.open(step, mmap=torch.cuda.is_available()), here) or found
    return found


def spans_machines(world: int) -> bool:
    """True when the job's processes are on several machines (torchrun's LOCAL_WORLD_SIZE < WORLD_SIZE)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world)) < world


def commit_before_others_look(checkpoints: CheckpointManager, found: ResumePoint) -> ResumePoint | None:
    """The newest checkpoint is staged on this machine's disk only (a previous session's upload did not
    finish): on a job over several machines the others cannot read it there, so it is uploaded (committed)
    before its step is broadcast. If the bucket will not take it, the newest committed one is used."""
    ckpt = found.checkpoint
    log.info("uploading the checkpoint of step %d, staged on this machine only, before the other machines "
             "load it", ckpt.step)
    try:
        checkpoints.commit_now(ckpt)
    except (storage.StorageError, OSError) as e:  # denied, unreachable after retries, a broken bucket path
        committed = checkpoints.committed()
        log.warning("the staged checkpoint of step %d could not be uploaded (%s); the other machines cannot read "
                    "it, so this session resumes from %s; it stays staged here", ckpt.step, e,
                    f"step {committed[0].step}" if committed else "the start")
        return checkpoints.open(committed[0].step, mmap=torch.cuda.is_available()) if committed else None
    return found  # the same files, now also in the bucket: what this rank loaded stays valid


def start_over(run_uri: str, checkpoints: CheckpointManager) -> None:
    """--fresh: remove the run's checkpoints (committed and staged), metrics and usage record (and its W&B run id:
    the new start logs to a new W&B run)."""
    log.warning("--fresh: deleting the checkpoints, metrics and usage record of %s", run_uri)
    checkpoints.delete_everything((CKPT_DIR, METRICS_FILE, USAGE_FILE, TB_DIR, SAMPLES_DIR, WANDB_RUN_FILE))
    local = local_run_dir(run_uri)
    if not storage.is_local(run_uri):
        shutil.rmtree(local, ignore_errors=True)
