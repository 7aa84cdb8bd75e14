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
from pathlib import Path

import torch
import torch.distributed as dist

from voxrelay.checkpoint.manager import MODEL_FILE, STATE_FILE, model_writer, state_writer
from voxrelay.config import ConfigError, config_changes
from voxrelay.data import identity as ident
from voxrelay.train import state as st
from voxrelay.train.sharded import load_sharded
from voxrelay.train.strategies import check_base, describe_base, load_trainable

BASE_HASH = "base_hash"  # manifest key: the LoRA base's hash, read by synthesis and export

log = logging.getLogger(__name__)


def gather_rng() -> list[dict]:
    """RNG state of every rank (a collective: every rank must call it)."""
    mine = st.rng_state()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [mine]
    # as bytes in uint8 tensors (padded to the longest), read back with weights_only=True
    buf = io.BytesIO()
    torch.save(mine, buf)
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    world = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([data.numel()]))
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: data.numel()] = data
    parts = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(parts, padded)
    return [torch.load(io.BytesIO(p[: int(n.item())].numpy().tobytes()), weights_only=True)
            for p, n in zip(parts, sizes, strict=True)]


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
        # fp16 on a GPU: the loss scale must survive too
        st.K_SCALER: run.accelerator.scaler.state_dict() if run.accelerator.scaler is not None else None,
    }


def save_checkpoint(run, metrics: dict | None = None, background: bool = True, stopped: str | None = None) -> float:
    """Copy the state (rank 0) and hand it to the upload thread, which stages it on local disk
    and uploads it (fsdp: every rank copies its shards, a thread writes them, see ShardSaver);
    ``background=False`` stages before returning (last or emergency save).
    ``stopped``: why the run stops here early (recorded in the manifest; `status` shows it).
    Returns the seconds the training thread was blocked."""
    t0 = time.perf_counter()
    rngs = gather_rng()
    extra = {"metrics": metrics or {}, "config_hash": run.cfg.hash(), **({"stopped": stopped} if stopped else {}),
             **({BASE_HASH: run.base_hash} if run.base_hash else {})}
    if run.sharded:  # every rank copies its shards; written and staged in a thread unless background=False
        expected = sum(p.numel() * p.element_size() for p in run.module.parameters() if p.requires_grad) * 4
        run.shard_saver.save(run, train_state(run, rngs), extra, expected, background=background)
    elif run.accelerator.is_main_process:
        model_state = run.model_state()
        expected = sum(t.numel() * t.element_size() for t in model_state.values()) * 4  # + AdamW moments
        run.checkpoints.save(
            run.loop.step,
            {MODEL_FILE: model_writer(model_state), STATE_FILE: state_writer(train_state(run, rngs))}, extra,
            expected_bytes=expected, background=background,
        )
    run.accelerator.wait_for_everyone()
    return time.perf_counter() - t0


def check_compatible(saved: dict, run_cfg, index: dict, step: int, num_checkpoints: int) -> None:
    """Raise ConfigError naming what differs between the checkpoint of ``step`` (its config and the
    prepared data it was trained on) and this run (``run_cfg`` and the prepared ``index``)."""
    safe, bad = config_changes(saved[st.K_CONFIG], run_cfg.to_dict())
    data = ident.describe_changes(saved.get(st.K_DATA_FINGERPRINT), index)
    fixes = []
    if bad:
        fixes.append("resume with the original values (`voxrelay config show` on the run's config.yaml lists them)")
    if data:
        fixes.append("restore the prepared data: put the sources back as they were and re-run `voxrelay prepare` "
                     "with the original values (or point data.name at the data the run was trained on)")
    if bad or data:
        what = ([f"incompatible changes: {', '.join(bad)}"] if bad else []) + \
            ([f"the prepared data {run_cfg.prepared_uri} changed since step {step}: {'; '.join(data)}"] if data else [])
        raise ConfigError(
            f"cannot resume {run_cfg.run_uri} from step {step}: {'. '.join(what)}. To continue this run, "
            f"{' and '.join(fixes)}. To train with the new settings and keep this run, use another run name "
            f"(name={run_cfg.name}-2). Last resort: --fresh deletes this run's {num_checkpoints} checkpoint(s) "
            "and metrics and starts over"
        )
    if safe:
        log.info("resuming with changed settings: %s", ", ".join(safe))


def load_weights(model, found: tuple, run_cfg, base: str | None, num_checkpoints: int) -> None:
    """The weights of ``found`` (checkpoint, tensors, train state) into ``model.module`` before accelerate
    wraps it: every tensor, or with LoRA (``base`` = the hash of the base just built) the trained ones,
    once the checkpoint's base hash matches."""
    ckpt, weights, state = found
    if base is None:
        if not isinstance(weights, Path):  # a sharded checkpoint loads once the model is sharded (restore)
            model.module.load_state_dict(weights)
        return
    check_base(
        state.get(st.K_BASE_HASH), base, describe_base(run_cfg.model, run_cfg.train.seed),
        f"cannot resume {run_cfg.run_uri} from step {ckpt.step}",
        "to continue this run, give it that base again (the same model.init_from weights: pin a hub revision; "
        f"for a random init the same torch version). To train on the new base, use another run name "
        f"(name={run_cfg.name}-2). Last resort: --fresh deletes this run's {num_checkpoints} checkpoint(s) "
        "and metrics and starts over",
    )
    if not isinstance(weights, Path):
        load_trainable(model.module, weights, f"checkpoint {ckpt.uri}")


def restore(run, found: tuple) -> None:
    """Load everything but the weights of a whole-model checkpoint (loaded before accelerate wraps the
    model); a sharded checkpoint's weights and optimizer come from its folder (``found[1]``) here."""
    _, weights, state = found
    run.loop.load_state_dict(state[st.K_LOOP])
    if isinstance(weights, Path):
        load_sharded(run, weights)
    else:
        run.optimizer.load_state_dict(state[st.K_OPTIMIZER])
    run.scheduler.load_state_dict(state[st.K_SCHEDULER])
    run.stream.load_state_dict(state[st.K_DATA])
    if state.get(st.K_SCALER) is not None and run.accelerator.scaler is not None:
        run.accelerator.scaler.load_state_dict(state[st.K_SCALER])
    rngs = state[st.K_RNG]
    rank = run.accelerator.process_index
    if rank < len(rngs):
        st.set_rng_state(rngs[rank])
    else:  # more processes than when saved: a new rank gets a fresh, seeded stream
        st.seed_everything(run.cfg.train.seed + rank)


def broadcast_step(step: int | None) -> int | None:
    """Rank 0's choice of checkpoint, for every rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return step
    box = [step]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_rank(flag: bool, device: torch.device | str = "cpu") -> bool:
    """True on every rank if it is True on any (so all ranks stop at the same step)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
