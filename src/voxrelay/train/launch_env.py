"""``accelerate launch --config_file <an FSDP config>``: the FSDP settings accelerate passes to the
processes in environment variables (accelerate 1.15 ``utils/launch.py``: ACCELERATE_USE_FSDP, FSDP_VERSION,
FSDP_SHARDING_STRATEGY, FSDP_RESHARD_AFTER_FORWARD, FSDP_OFFLOAD_PARAMS, FSDP_ACTIVATION_CHECKPOINTING, ...)
mapped onto ``train.strategy`` / ``fsdp_sharding`` / ``cpu_offload`` / ``gradient_checkpointing``.

Keys the voxrelay config sets explicitly (YAML or command line) win over accelerate's; accelerate's fill
the ones it leaves unset. Training then always goes through voxrelay's own FSDP2 code path
(:func:`~voxrelay.train.strategies.apply_fsdp` + DCP checkpoints): accelerate's FSDP plugin is switched off
for this process (on CPU accelerate 1.15 ignores it anyway and would silently train plain DDP).
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
# accelerate's FSDP1 sharding strategies (names, or 1-based numbers) -> train.fsdp_sharding (None: no sharding)
_SHARDING = {"FULL_SHARD": "full_shard", "SHARD_GRAD_OP": "shard_grad_op", "NO_SHARD": None,
             "HYBRID_SHARD": "hybrid", "HYBRID_SHARD_ZERO2": "hybrid"}
# read, but with nothing to map: what voxrelay does instead
_NOTES = {
    "FSDP_AUTO_WRAP_POLICY": "voxrelay shards each decoder layer of the model family (transformer-based wrap)",
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "voxrelay takes the layer classes from the model family",
    "FSDP_STATE_DICT_TYPE": "voxrelay checkpoints are sharded (DCP); `voxrelay export` writes the full model",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "not applied: every process builds the model, then shards it",
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
    return {"strategy": "fsdp", "fsdp_sharding": sharding, "cpu_offload": _true(env.get("FSDP_OFFLOAD_PARAMS")),
            "gradient_checkpointing": _true(env.get("FSDP_ACTIVATION_CHECKPOINTING"))}


def apply_accelerate_env(cfg: RunConfig, env: MutableMapping[str, str] = os.environ) -> RunConfig:
    """``cfg`` with the settings of an accelerate FSDP launch filled in (explicit config keys win), logged;
    accelerate's own FSDP plugin is then switched off in ``env`` so that the Accelerator does not use it."""
    wanted = accelerate_fsdp_settings(env)
    if not wanted:
        return cfg
    explicit = cfg.train.model_fields_set
    taken = {k: v for k, v in wanted.items() if k not in explicit}
    kept = {k: getattr(cfg.train, k) for k, v in wanted.items() if k in explicit and getattr(cfg.train, k) != v}
    try:
        cfg.train = TrainConfig.model_validate(cfg.train.model_dump() | taken)
    except ValidationError as e:
        raise ConfigError(f"the accelerate FSDP launch settings {taken} do not fit this config: "
                          f"{one_line(e)[:300]}; set the train.* keys in the voxrelay config") from None
    fmt = lambda d: ", ".join(f"train.{k}={v}" for k, v in d.items()) or "none"  # noqa: E731
    log.info("accelerate launch FSDP config (FSDP_VERSION=%s): taken: %s; the voxrelay config's own keys win: %s. "
             "Training uses voxrelay's FSDP2 code path (fully_shard + torch.distributed.checkpoint), not "
             "accelerate's FSDP plugin (on CPU accelerate ignores it)%s", env.get("FSDP_VERSION", "1"), fmt(taken),
             fmt(kept), "".join(f"; {k}={env[k]}: {note}" for k, note in _NOTES.items() if env.get(k)))
    env[USE_FSDP] = "false"
    return cfg
