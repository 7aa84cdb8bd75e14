"""What a checkpoint of a run holds, and how a run is restored from one.

``train_state.pt`` keys: loop counters, optimizer, scheduler, data cursor, RNG of every rank,
the resolved config, a fingerprint of the prepared data and, with LoRA, the hash of the frozen base
(also in the manifest, for synthesis and export, which read no train state). On resume, changed config keys are
classified (:func:`voxrelay.config.config_changes`): allowed ones are applied, incompatible ones
stop with an error listing them (use ``--fresh`` or another run name).
"""

from __future__ import annotations

import io
import logging
import time

import torch
import torch.distributed as dist

from voxrelay.checkpoint.format import BASE_HASH, WRITER  # noqa: F401 (defined in checkpoint/format.py)
from voxrelay.checkpoint.frozen import check_base, describe_base, trainable_state
from voxrelay.checkpoint.manager import MODEL_FILE, STATE_FILE, ResumePoint, model_writer, state_writer
from voxrelay.checkpoint.reader import read_into
from voxrelay.checkpoint.shard_saver import load_sharded
from voxrelay.checkpoint.sharded import is_sharded
from voxrelay.config import ConfigError, config_changes, with_added_defaults
from voxrelay.data import identity as ident
from voxrelay.train import state as st

log = logging.getLogger(__name__)


def gather_rng(ranks, generators: dict | None = None) -> list[dict]:
    """RNG state of every rank, in rank order (a collective over the job's gloo group: every rank calls it).
    Sent as torch.save bytes and read back with weights_only=True (pickled tensors do not survive an
    object collective's unpickler in torch 2.13)."""
    buf = io.BytesIO()
    torch.save(st.rng_state(generators), buf)
    return [torch.load(io.BytesIO(blob), weights_only=True) for blob in ranks.gather(buf.getvalue())]


def train_state(run, rngs: list[dict]) -> dict:
    """Everything but the weights; under fsdp the optimizer state is sharded beside them (DCP), not here."""
    return {
        st.K_LOOP: run.loop.state_dict(),
        **({} if run.sharded else {st.K_OPTIMIZER: run.optimizer.state_dict()}),
        st.K_SCHEDULER: run.scheduler.state_dict(),
        st.K_DATA: run.stream.state_dict(),
        st.K_RNG: rngs,
        st.K_CONFIG_HASH: run.cfg.hash(),
        st.K_CONFIG: run.cfg.to_dict(),
        st.K_DATA_FINGERPRINT: run.data_fingerprint,
        st.K_BASE_HASH: run.base_hash,
        **({st.K_FAMILY: extra} if (extra := run.model.extra_state()) else {}),
        # fp16 on a GPU: the loss scale must survive too
        st.K_SCALER: run.accelerator.scaler.state_dict() if run.accelerator.scaler is not None else None,
    }


def save_checkpoint(run, metrics: dict | None = None, background: bool = True, stopped: str | None = None) -> float:
    """Copy the state (rank 0) and hand it to the upload thread, which stages it on local disk
    and uploads it (fsdp: every rank copies its shards, a thread writes them, see ShardSaver);
    ``background=False`` stages before returning (last or emergency save).
    ``stopped``: why the run stops here early (recorded in the manifest; `status` shows it).
    Every rank calls it at the same step. A save that cannot be made (no room on the staging disk) is
    reported and counted (``checkpoint.max_failed_saves``), not raised: the ranks stay in step.
    Saving a step that is already saved or on its way is a no-op. Returns the seconds the training
    thread was blocked."""
    t0, step = time.perf_counter(), run.loop.step
    if run.sharded:
        run.shard_saver.wait()  # a save in flight is staged (or failed) before we ask what is held
    if run.ranks.broadcast(run.checkpoints.holds(step) if run.ranks.main else None):
        log.info("the checkpoint of step %d is already saved or on its way; not saving it again", step)
        return 0.0
    rngs = gather_rng(run.ranks, run.model.generators())
    extra = {"metrics": metrics or {}, "config_hash": run.cfg.hash(), **({"stopped": stopped} if stopped else {}),
             **({BASE_HASH: run.base_hash} if run.base_hash else {}),
             **({WRITER: run.lease.record["token"]} if run.lease is not None else {})}
    if run.sharded:  # every rank copies its shards; written and staged in a thread unless background=False
        expected = sum(p.numel() * p.element_size() for p in run.module.parameters() if p.requires_grad) * 4
        run.shard_saver.save(run.shards(), run.checkpoints, step, train_state(run, rngs), extra, expected,
                             background=background)
    elif run.accelerator.is_main_process:
        try:  # whatever fails here is counted, never raised: the other ranks wait for this one below
            model_state = run.model_state()
            expected = sum(t.numel() * t.element_size() for t in model_state.values()) * 4  # + AdamW moments
            run.checkpoints.save(step, {MODEL_FILE: model_writer(model_state), STATE_FILE: state_writer(
                train_state(run, rngs))}, extra, expected_bytes=expected, background=background)
        except Exception as err:  # noqa: BLE001 (no room to stage it, its write failed, a state that cannot be
            # copied: reported and counted, checkpoint.max_failed_saves stops the run on every rank alike)
            run.checkpoints.save_failed(step, err)
    run.accelerator.wait_for_everyone()
    return time.perf_counter() - t0


def check_compatible(saved: dict, run_cfg, index: dict, step: int, num_checkpoints: int,
                     can_pack: bool = False) -> None:
    """Raise ConfigError naming what differs between the checkpoint of ``step`` (its config and the
    prepared data it was trained on) and this run (``run_cfg`` and the prepared ``index``). ``can_pack``: the
    run's family packs batches (``train.packing: auto`` then means true)."""
    safe, bad = config_changes(saved[st.K_CONFIG], run_cfg.to_dict())
    bad = [k for k in bad if k not in ("train.shuffle_window", "train.packing")]  # compared by what they give:
    if not _same_windows(saved[st.K_CONFIG], run_cfg, index):
        bad.append("train.shuffle_window")
    old_cfg = with_added_defaults(saved[st.K_CONFIG])  # a key added since stands for what the run did then
    was = _dotted(old_cfg, "train.packing")
    if _packs(was, can_pack) != _packs(run_cfg.train.packing, can_pack):
        bad.append("train.packing")
    elif was != run_cfg.train.packing:
        safe.append("train.packing")
    data = ident.describe_changes(saved.get(st.K_DATA_FINGERPRINT), index)
    fixes, new_cfg = [], run_cfg.to_dict()
    if bad:
        fixes.append("resume with the original values: " + " ".join(
            f"{k}={_dotted(old_cfg, k)}" for k in bad if k != "train.shuffle_window")
            + " (`voxrelay config show` on the run's config.yaml lists them all)")
    if data:
        fixes.append("restore the prepared data: put the sources back as they were and re-run `voxrelay prepare` "
                     "with the original values (or point data.name at the data the run was trained on)")
    if bad or data:
        changes = ", ".join(f"{k} {_dotted(old_cfg, k)!r} -> {_dotted(new_cfg, k)!r}" for k in bad)
        what = ([f"incompatible changes: {changes}"] if bad else []) + \
            ([f"the prepared data {run_cfg.prepared_uri} changed since step {step}: {'; '.join(data)}"] if data else [])
        raise ConfigError(
            f"cannot resume {run_cfg.run_uri} from step {step}: {'. '.join(what)}. To continue this run, "
            f"{' and '.join(fixes)}. To train with the new settings and keep this run, use another run name "
            f"(name={run_cfg.name}-2). Last resort: --fresh deletes this run's {num_checkpoints} checkpoint(s) "
            "and metrics and starts over"
        )
    if safe:
        log.info("resuming with changed settings: %s", ", ".join(safe))


def _packs(setting, can_pack: bool) -> bool:
    """Whether ``train.packing`` = ``setting`` packs batches (what :func:`voxrelay.train.data.packing` decides)."""
    return setting is True or (setting == "auto" and can_pack)


def _dotted(cfg: dict, key: str):
    """The value of dotted ``key`` in a config dict (None where a level is missing)."""
    for part in key.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg


def _same_windows(saved_cfg: dict, run_cfg, index: dict) -> bool:
    """Whether the saved and the new ``train.shuffle_window`` give the same batch plan on this data: a window of
    at least the split's shard count (or 0) is the global shuffle. A run saved before windows existed had the
    global shuffle (0), whatever the default is now."""
    shards = sum(1 for s in index.get("shards", []) if s["split"] == "train")
    old = saved_cfg.get("train", {}).get("shuffle_window", 0)
    return {0 if w == 0 or w >= shards else w for w in (old, run_cfg.train.shuffle_window)} == {0} or \
        old == run_cfg.train.shuffle_window


def load_weights(model, found: tuple, run_cfg, base: str | None, num_checkpoints: int) -> None:
    """The weights of ``found`` (checkpoint, verified local folder, train state) into ``model.module`` before
    accelerate wraps it, read tensor by tensor into the module's own storage (no second copy in memory):
    every tensor, or with LoRA (``base`` = the hash of the base just built) the trained ones, once the
    checkpoint's base hash matches. A sharded checkpoint loads once the model is sharded (:func:`restore`)."""
    ckpt, folder, state = found
    if base is not None:
        check_base(
            state.get(st.K_BASE_HASH), base, describe_base(run_cfg.model, run_cfg.train.seed),
            f"cannot resume {run_cfg.run_uri} from step {ckpt.step}",
            "to continue this run, give it that base again (the same model.init_from weights: pin a hub revision; "
            f"for a random init the same torch version). To train on the new base, use another run name "
            f"(name={run_cfg.name}-2). Last resort: --fresh deletes this run's {num_checkpoints} checkpoint(s) "
            "and metrics and starts over",
        )
    if is_sharded(ckpt.manifest):
        return
    targets = model.module.state_dict() if base is None else trainable_state(model.module)
    read_into(folder / MODEL_FILE, targets, f"checkpoint {ckpt.uri}",
              "it was written with other model or train.lora settings: use the settings of the run that wrote it")


def restore(run, found: ResumePoint) -> None:
    """Load everything but the weights of a whole-model checkpoint (loaded before accelerate wraps the
    model); a sharded checkpoint's weights and optimizer come from its folder (``found.folder``) here."""
    ckpt, folder, state = found
    run.loop.load_state_dict(state[st.K_LOOP])
    if is_sharded(ckpt.manifest):
        load_sharded(run.shards(), folder, ckpt.uri)  # ckpt.uri: the checkpoint its errors name
    else:
        run.optimizer.load_state_dict(state[st.K_OPTIMIZER])  # each state moved to its parameter's device
    run.scheduler.load_state_dict(state[st.K_SCHEDULER])
    run.stream.load_state_dict(state[st.K_DATA])
    if state.get(st.K_SCALER) is not None and run.accelerator.scaler is not None:
        run.accelerator.scaler.load_state_dict(state[st.K_SCALER])
    run.model.load_extra_state(state.get(st.K_FAMILY) or {})
    rngs = state[st.K_RNG]
    rank = run.accelerator.process_index
    if rank < len(rngs):
        st.set_rng_state(rngs[rank], run.model.generators())
    else:  # more processes than when saved: a new rank gets a fresh, seeded stream (its generators keep theirs)
        st.seed_everything(run.cfg.train.seed + rank)


def any_rank(flag: bool, device: torch.device | str = "cpu") -> bool:
    """True on every rank if it is True on any, over the default group: ``device`` must be the one
    that group's backend takes (the accelerator's: CUDA under NCCL). For the training step's own
    flags; decisions about saving and stopping go through :class:`voxrelay.train.ranks.Ranks`."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
