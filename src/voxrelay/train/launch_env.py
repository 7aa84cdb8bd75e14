"""``accelerate launch --config_file <a user's accelerate config>``: every setting the launcher passes to the
processes (accelerate 1.15 ``utils/launch.py`` exports them as environment variables: ACCELERATE_MIXED_PRECISION,
ACCELERATE_USE_FSDP, FSDP_VERSION, FSDP_SHARDING_STRATEGY, FSDP_OFFLOAD_PARAMS, ...) is either taken onto the
``train.*`` keys it stands for, done by accelerate itself, what voxrelay does anyway, or named as not applied.

Keys the voxrelay config sets explicitly (YAML or command line) win over accelerate's; accelerate's fill the
ones it leaves unset. ``train.precision`` is passed to the Accelerator explicitly, so ACCELERATE_MIXED_PRECISION
(the config's ``mixed_precision``) only counts once it is taken here. FSDP training always goes through voxrelay's
own FSDP2 code path (:func:`~voxrelay.train.strategies.apply_fsdp` + DCP checkpoints): accelerate's FSDP plugin
is switched off for this process (on CPU accelerate 1.15 ignores it anyway and would silently train plain DDP).

What the launcher consumes itself (num_processes, num_machines, machine_rank, main_process_ip/port, rdzv_backend,
gpu_ids: torchrun's world) or applies only on TPUs (downcast_bf16, tpu_*) never reaches the processes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping

from pydantic import ValidationError

from voxrelay.config import ConfigError, RunConfig, TrainConfig
from voxrelay.errors import one_line

log = logging.getLogger(__name__)

USE_FSDP = "ACCELERATE_USE_FSDP"
MIXED_PRECISION = "ACCELERATE_MIXED_PRECISION"  # exported by every `accelerate launch`
# accelerate's FSDP1 sharding strategies (names, or 1-based numbers) -> train.fsdp_sharding (None: no sharding)
_SHARDING = {"FULL_SHARD": "full_shard", "SHARD_GRAD_OP": "shard_grad_op", "NO_SHARD": None,
             "HYBRID_SHARD": "hybrid", "HYBRID_SHARD_ZERO2": "hybrid"}
# taken onto train.* keys (accelerate_settings)
MAPPED = {USE_FSDP, MIXED_PRECISION, "FSDP_VERSION", "FSDP_SHARDING_STRATEGY", "FSDP_RESHARD_AFTER_FORWARD",
          "FSDP_OFFLOAD_PARAMS", "FSDP_ACTIVATION_CHECKPOINTING"}
# read by accelerate's Accelerator (or the process) itself: voxrelay leaves them to it; and the dynamo backend's
# options, which go with the backend (named below when it is on)
BY_ACCELERATE = {"ACCELERATE_USE_CPU", "ACCELERATE_DEBUG_MODE", "ACCELERATE_CPU_AFFINITY", "OMP_NUM_THREADS",
                 "ACCELERATE_DYNAMO_MODE", "ACCELERATE_DYNAMO_USE_FULLGRAPH", "ACCELERATE_DYNAMO_USE_DYNAMIC",
                 "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"}
# value -> what voxrelay's FSDP2 path does that is the same thing (an FSDP setting with any other value: _NOT_APPLIED)
_AS_VOXRELAY = {
    ("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP"): "each decoder layer of the model family is a unit",
    ("FSDP_BACKWARD_PREFETCH", "BACKWARD_PRE"): "FSDP2 prefetches the next unit's gather in backward",
    ("FSDP_STATE_DICT_TYPE", "SHARDED_STATE_DICT"): "checkpoints are sharded (DCP)",
    ("FSDP_USE_ORIG_PARAMS", "true"): "FSDP2 keeps the original parameters",
    ("FSDP_SYNC_MODULE_STATES", "true"): "every process builds the same weights",
    ("FSDP_FORWARD_PREFETCH", "false"): "", ("FSDP_CPU_RAM_EFFICIENT_LOADING", "false"): "",
    ("ACCELERATE_DYNAMO_BACKEND", "NO"): "",
    ("FSDP_MIN_NUM_PARAMS", "0"): "", ("ACCELERATE_USE_DEEPSPEED", "false"): "",
    ("ACCELERATE_USE_MEGATRON_LM", "false"): "",
}
_NOT_APPLIED = {  # a setting voxrelay does not apply, and what it does instead
    "FSDP_AUTO_WRAP_POLICY": "voxrelay shards each decoder layer of the model family (transformer-based wrap)",
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "voxrelay takes the layer classes from the model family",
    "FSDP_MIN_NUM_PARAMS": "size-based wrapping only; voxrelay shards each decoder layer",
    "FSDP_BACKWARD_PREFETCH": "FSDP2's own prefetching",
    "FSDP_FORWARD_PREFETCH": "FSDP2's own prefetching",
    "FSDP_STATE_DICT_TYPE": "voxrelay checkpoints are sharded (DCP); `voxrelay export` writes the full model",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "every process builds the model, then shards it",
    "FSDP_USE_ORIG_PARAMS": "FSDP2 keeps the original parameters",
    "FSDP_SYNC_MODULE_STATES": "every process builds the same weights (same seed, same init_from)",
    "FSDP_IGNORED_MODULES": "every module is sharded",
    "ACCELERATE_DYNAMO_BACKEND": "voxrelay does not torch.compile the model",
    "ACCELERATE_USE_DEEPSPEED": "voxrelay trains with DDP or its FSDP2 (train.strategy)",
    "ACCELERATE_USE_MEGATRON_LM": "voxrelay trains with DDP or its FSDP2 (train.strategy)",
}


def _true(value: str | None) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes")


def _sharding(env: MutableMapping[str, str]) -> str | None:
    """train.fsdp_sharding from accelerate's settings; None for NO_SHARD (that is DDP)."""
    raw = env.get("FSDP_SHARDING_STRATEGY", "FULL_SHARD").strip().upper()
    names = list(_SHARDING)
    name = names[int(raw) - 1] if raw.isdigit() and 1 <= int(raw) <= len(names) else raw
    sharding = _SHARDING.get(name, "full_shard")
    reshard = _true(env.get("FSDP_RESHARD_AFTER_FORWARD", "true"))
    if sharding == "full_shard" and env.get("FSDP_VERSION") == "2" and not reshard:
        return "shard_grad_op"  # FSDP2 spells SHARD_GRAD_OP as reshard_after_forward: false
    return sharding


def accelerate_fsdp_settings(env: MutableMapping[str, str]) -> dict[str, object]:
    """The train.* values an accelerate FSDP launch asks for ({} when it is not one)."""
    if not _true(env.get(USE_FSDP)):
        return {}
    sharding = _sharding(env)
    if sharding is None:
        return {"strategy": "ddp"}
    settings = {"strategy": "fsdp", "fsdp_sharding": sharding, "cpu_offload": _true(env.get("FSDP_OFFLOAD_PARAMS")),
                "gradient_checkpointing": _true(env.get("FSDP_ACTIVATION_CHECKPOINTING"))}
    # accelerate's activation_checkpointing_offload: each checkpointed layer's input in pinned host memory
    if _true(env.get("FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD")):
        settings["activation_offload"] = True
    return settings


def accelerate_settings(env: MutableMapping[str, str]) -> tuple[dict[str, object], dict[str, str], dict[str, str]]:
    """(train.* values the launch asks for, settings done as voxrelay does anyway -> how, settings not applied ->
    what voxrelay does instead), each setting ``NAME=value``; empty when this is not an ``accelerate launch``."""
    if MIXED_PRECISION not in env and USE_FSDP not in env:
        return {}, {}, {}
    wanted = accelerate_fsdp_settings(env)
    precision = env.get(MIXED_PRECISION, "no").strip().lower()
    if precision in ("no", "bf16", "fp16"):
        wanted["precision"] = precision
    fsdp = wanted.get("strategy") == "fsdp"
    same: dict[str, str] = {}
    other: dict[str, str] = {} if precision in ("no", "bf16", "fp16") else {
        f"{MIXED_PRECISION}={precision}": "voxrelay trains in fp32, bf16 or fp16 (train.precision)"}
    size_based = env.get("FSDP_AUTO_WRAP_POLICY", "").strip() == "SIZE_BASED_WRAP"
    for name, raw in sorted(env.items()):
        value = raw.strip()
        if name not in _NOT_APPLIED or (name.startswith("FSDP_") and not fsdp):
            continue
        how = _AS_VOXRELAY.get((name, value))
        if how is None and name == "FSDP_MIN_NUM_PARAMS" and not size_based:  # accelerate's use of it too
            how = "used by size-based wrapping only, as in accelerate"
        if how:
            same[f"{name}={value}"] = how
        elif how is None and value.lower() not in ("false", "0", ""):  # how == "": off, nothing asked for
            other[f"{name}={value}"] = _NOT_APPLIED[name]
    return wanted, same, other


def launched_rank() -> int:
    """This process's rank in its job as the launcher set it (torchrun, accelerate launch); 0 when alone."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def one_voice_per_job() -> None:
    """In every process but the job's first, voxrelay's informational lines are left out: they describe the job
    (the same on every process) and would print once per process; warnings and errors still show. (On the
    handlers: a logger's own filters do not see its children's records.)"""
    if launched_rank() > 0:
        for handler in logging.getLogger().handlers:
            if not any(isinstance(f, _FirstProcessSays) for f in handler.filters):
                handler.addFilter(_FirstProcessSays())


class _FirstProcessSays(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.name.startswith("voxrelay")


def apply_accelerate_env(cfg: RunConfig, env: MutableMapping[str, str] = os.environ) -> RunConfig:
    """``cfg`` with the settings of an ``accelerate launch`` filled in (explicit config keys win), said once per
    job; accelerate's own FSDP plugin is then switched off in ``env`` so that the Accelerator does not use it."""
    wanted, same, other = accelerate_settings(env)
    if not (wanted or same or other):
        return cfg
    explicit = cfg.train.model_fields_set
    taken = {k: v for k, v in wanted.items() if k not in explicit}
    kept = {k: getattr(cfg.train, k) for k, v in wanted.items() if k in explicit and getattr(cfg.train, k) != v}
    try:  # the keys set so far stay the set ones (a resume's checks of explicit keys read them)
        train = TrainConfig.model_validate(cfg.train.model_dump(exclude_unset=True) | taken)
    except ValidationError as e:
        raise ConfigError(f"the accelerate launch settings {taken} do not fit this config: "
                          f"{one_line(e)[:300]}; set the train.* keys in the voxrelay config") from None
    cfg.train = train
    if train.strategy != "fsdp":  # the voxrelay config's own strategy won: the FSDP settings are moot, not applied
        same = {k: v for k, v in same.items() if not k.startswith("FSDP_")}
        other = {k: v for k, v in other.items() if not k.startswith("FSDP_")}
    if launched_rank() == 0:
        _say(env, taken, kept, same, other)
    if _true(env.get(USE_FSDP)):
        env[USE_FSDP] = "false"
    return cfg


def _say(env: MutableMapping[str, str], taken: dict, kept: dict, same: dict[str, str], other: dict[str, str]) -> None:
    def fmt(d: dict) -> str:
        return ", ".join(f"train.{k}={v}" for k, v in d.items()) or "none"

    fsdp = (f" (FSDP_VERSION={env.get('FSDP_VERSION', '1')}); training uses voxrelay's FSDP2 code path (fully_shard "
            "+ torch.distributed.checkpoint), not accelerate's FSDP plugin") if taken.get("strategy") == "fsdp" or \
        kept.get("strategy") == "fsdp" else ""
    anyway = "; as voxrelay does anyway: " + "; ".join(f"{k} ({v})" for k, v in same.items()) if same else ""
    log.info("accelerate launch config%s: taken: %s; the voxrelay config's own keys win: %s%s", fsdp, fmt(taken),
             fmt(kept), anyway)
    if other:
        log.warning("accelerate launch config: not applied: %s", "; ".join(f"{k} ({v})" for k, v in other.items()))
