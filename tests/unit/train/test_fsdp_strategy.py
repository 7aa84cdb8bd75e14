"""Strategy settings: train.strategy / fsdp_sharding / cpu_offload / gradient_checkpointing validation, the
mapping of an `accelerate launch` FSDP environment onto them (explicit config keys win), gradient
checkpointing that leaves the gradients unchanged (dropout masks replayed), and FSDP2 sharding with
sharded save/load in a world of one process."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.unit.train.test_strategies import DATA, TINY, batch
from voxrelay.config import ConfigError, config_changes, load_config
from voxrelay.models.codec_lm.config import CodecLMConfig
from voxrelay.models.registry import build_model
from voxrelay.train.launch_env import USE_FSDP, accelerate_fsdp_settings, apply_accelerate_env
from voxrelay.train.strategies import enable_gradient_checkpointing

SEED_001 = {  # what `accelerate launch` exports for seed 001's config (fsdp_version 2, FULL_SHARD)
    "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_SHARDING_STRATEGY": "FULL_SHARD",
    "FSDP_RESHARD_AFTER_FORWARD": "true", "FSDP_OFFLOAD_PARAMS": "false", "FSDP_ACTIVATION_CHECKPOINTING": "false",
    "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP", "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "true",
}


def test_strategy_settings_that_cannot_work_are_config_errors():
    with pytest.raises(ConfigError, match="cpu_offload=true needs train.strategy=fsdp"):
        load_config(None, ["train.cpu_offload=true"])
    with pytest.raises(ConfigError, match="set train.precision=bf16 or no"):
        load_config(None, ["train.strategy=fsdp", "train.precision=fp16"])
    with pytest.raises(ConfigError, match="fsdp_sharding"):
        load_config(None, ["train.strategy=fsdp", "train.fsdp_sharding=zero3"])
    # bitsandbytes' 8-bit step fails on FSDP2's DTensors (seen on an H200 and on CPU: "got mixed torch.Tensor
    # and DTensor"): refused before any weight is loaded, and plan never prices the pair
    with pytest.raises(ConfigError, match="adamw_8bit.*train.strategy=fsdp"):
        load_config(None, ["train.strategy=fsdp", "train.optimizer=adamw_8bit"])
    from voxrelay.plan import strategies

    priced = strategies(8, "adamw")
    assert any(s.optimizer == "adamw_8bit" for s in priced) and any(s.strategy == "fsdp" for s in priced)
    assert not [s for s in priced if s.strategy == "fsdp" and s.optimizer == "adamw_8bit" and not s.cpu_offload]
    cfg = load_config(None, ["train.strategy=fsdp", "train.cpu_offload=true", "train.precision=bf16"])
    assert (cfg.train.strategy, cfg.train.fsdp_sharding, cfg.train.cpu_offload) == ("fsdp", "full_shard", True)


@pytest.mark.parametrize(("env", "expected"), [
    ({}, {}),
    ({"ACCELERATE_USE_FSDP": "false"}, {}),
    (SEED_001, {"strategy": "fsdp", "fsdp_sharding": "full_shard", "cpu_offload": False,
                "gradient_checkpointing": False}),
    (SEED_001 | {"FSDP_RESHARD_AFTER_FORWARD": "false"}, {"strategy": "fsdp", "fsdp_sharding": "shard_grad_op",
                                                          "cpu_offload": False, "gradient_checkpointing": False}),
    (SEED_001 | {"FSDP_VERSION": "1", "FSDP_SHARDING_STRATEGY": "4", "FSDP_OFFLOAD_PARAMS": "true",
                 "FSDP_ACTIVATION_CHECKPOINTING": "true"},
     {"strategy": "fsdp", "fsdp_sharding": "hybrid", "cpu_offload": True, "gradient_checkpointing": True}),
    (SEED_001 | {"FSDP_SHARDING_STRATEGY": "NO_SHARD"}, {"strategy": "ddp"}),
])
def test_accelerate_fsdp_environment_maps_onto_train_keys(env, expected):
    assert accelerate_fsdp_settings(env) == expected


def test_explicit_config_keys_win_over_accelerate_and_its_plugin_is_switched_off(caplog):
    env = dict(SEED_001, FSDP_OFFLOAD_PARAMS="true")
    cfg = load_config(None, ["train.fsdp_sharding=shard_grad_op"])
    with caplog.at_level(logging.INFO, logger="voxrelay.train.launch_env"):
        cfg = apply_accelerate_env(cfg, env)
    assert (cfg.train.strategy, cfg.train.fsdp_sharding, cfg.train.cpu_offload) == ("fsdp", "shard_grad_op", True)
    assert env[USE_FSDP] == "false"  # the Accelerator built next must not set up accelerate's own FSDP
    assert "the voxrelay config's own keys win: train.fsdp_sharding=shard_grad_op" in caplog.text
    assert "voxrelay's FSDP2 code path" in caplog.text
    with pytest.raises(ConfigError, match="accelerate launch settings"):
        apply_accelerate_env(load_config(None, ["train.precision=fp16"]), dict(SEED_001))
    untouched = load_config(None, [])
    assert apply_accelerate_env(untouched, {}).train.strategy == "ddp"


def _grads(model, seed: int) -> dict[str, torch.Tensor]:
    model.module.train()
    model.module.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    model.loss(model.module, batch(model))["ce"].sum.backward()
    return {n: p.grad.clone() for n, p in model.module.named_parameters()}


def test_gradient_checkpointing_recomputes_with_the_same_dropout_masks():
    # with dropout the recomputed forward must draw the same masks as the first one
    model = build_model(CodecLMConfig(**TINY, dropout=0.3), DATA, 0)
    plain = _grads(model, seed=5)
    enable_gradient_checkpointing(model, True)
    assert model.module.is_activation_checkpointing
    checkpointed = _grads(model, seed=5)
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=0, atol=1e-6, msg=name)
    assert not all(torch.equal(a, b) for a, b in zip(plain.values(), _grads(model, seed=6).values(), strict=True))


def test_memory_settings_may_change_on_resume_but_not_the_strategy():
    saved = load_config(None, ["train.strategy=fsdp"]).to_dict()
    now = load_config(None, ["train.strategy=fsdp", "train.fsdp_sharding=shard_grad_op", "train.cpu_offload=true",
                             "train.gradient_checkpointing=true"]).to_dict()
    safe, bad = config_changes(saved, now)
    assert (safe, bad) == (["train.cpu_offload", "train.fsdp_sharding", "train.gradient_checkpointing"], [])
    safe, bad = config_changes(saved, load_config(None, []).to_dict())  # sharded checkpoint, ddp run
    assert bad == ["train.strategy"]
    old = {k: v for k, v in saved.items()}  # a checkpoint from before these keys existed counts as ddp
    old["train"] = {k: v for k, v in saved["train"].items() if k not in ("strategy", "fsdp_sharding")}
    assert config_changes(old, load_config(None, []).to_dict()) == ([], [])


@pytest.mark.parametrize("offload", [False, True])
def test_cpu_offload_is_applied_to_every_unit_and_states_live_on_the_cpu(offload):
    """train.cpu_offload=true gives every FSDP unit and the root CPUOffloadPolicy (on this CPU host it moves
    nothing, so the policy itself is what can be checked), and after a step the parameters, their gradients and
    AdamW's states are all on the CPU; without it no unit has the policy."""
    import torch.distributed as dist

    own = not dist.is_initialized()  # a world of one, gone again after the test (others in this worker make theirs)
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        _offloaded_step(offload)
    finally:
        if own:
            dist.destroy_process_group()


def _offloaded_step(offload: bool) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy

    from voxrelay.train.strategies import apply_fsdp

    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    apply_fsdp(module, (torch.nn.Linear,), "full_shard", "no", offload, init_device_mesh("cpu", (1,)))
    units = [m for m in module.modules() if hasattr(m, "_get_fsdp_state")]
    assert len(units) == 3  # two layers and the root
    policies = [u._get_fsdp_state()._fsdp_param_group for u in units]
    assert [isinstance(g.offload_policy, CPUOffloadPolicy) for g in policies if g is not None] == [offload] * 2
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)
    module(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    tensors = [p for p in module.parameters()] + [p.grad for p in module.parameters()] + \
        [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    assert {t.device.type for t in tensors} == {"cpu"}


def test_hybrid_sharding_on_one_node_is_full_shard_and_says_so(caplog):
    """train.fsdp_sharding=hybrid with every process on one node: a 1-D mesh (nothing to replicate across),
    and the log says so."""
    import logging

    import torch.distributed as dist

    from voxrelay.train.strategies import fsdp_mesh

    own = not dist.is_initialized()
    caplog.set_level(logging.INFO, logger="voxrelay.train.strategies")
    try:
        mesh = fsdp_mesh("hybrid", "cpu")
        assert mesh.ndim == 1 and mesh.size() == dist.get_world_size()
        assert "FSDP hybrid on one node is full_shard" in caplog.text
    finally:
        if own and dist.is_initialized():
            dist.destroy_process_group()
