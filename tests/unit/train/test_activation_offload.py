"""``train.activation_offload``: only the inputs of the checkpointed layers go through the offload hooks and
come back, training with the layer inputs copied out and back is bit-equal to training without (dropout on;
DDP, LoRA and FSDP2 in a world of one), pinning is chosen by the machine, the combinations that cannot work are
refused naming the keys, and ``plan`` moves exactly those bytes from the GPU to the host. (Resume with offload:
tests/unit/train/test_plan_combinations.py, its ``act-offload`` rows; the plan against a measured peak:
tests/unit/test_plan_peak.py, row ``ddp-gc-offload-autocast``.)"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from tests.helpers.peak import HostCopies, _batch
from voxrelay.config import ConfigError, config_changes, load_config
from voxrelay.train.offload import ActivationOffload, offload_checkpoints, offloads, pin_host_memory

H, LAYERS, TOKENS = 32, 3, 120
BASE = [f"model.hidden_size={H}", "model.num_heads=2", f"model.intermediate_size={2 * H}",
        f"model.num_layers={LAYERS}", "model.dropout=0.1", "model.frames_per_position=null",
        "model.text_position_scale=null", "model.audio_embedding=free", "train.precision=no", "train.lr=1e-2",
        "train.warmup_steps=0", "train.gradient_checkpointing=true"]
# ddp with LoRA: tests/unit/train/test_plan_combinations.py's act-offload rows (CI time)
STRATEGIES = {"ddp-full": [], "fsdp-lora": ["train.strategy=fsdp", "train.lora.r=4", "train.lora.dropout=0.1"]}


def _train(overrides: list[str], hooks: ActivationOffload | None, steps: int = 3) -> tuple[dict, list[float], int]:
    """(final trainable weights, losses, tokens per micro-batch) of ``steps`` steps of voxrelay's own build and
    train_step; ``hooks`` replace the offload hooks the config installs."""
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from voxrelay.models.registry import build_model
    from voxrelay.plan.model import data_spec
    from voxrelay.train.build import bare_run
    from voxrelay.train.loop import train_step
    from voxrelay.train.state import seed_everything

    cfg = load_config(None, overrides)
    own_group = not dist.is_initialized()
    AcceleratorState._reset_state()
    try:
        seed_everything(0)
        model = build_model(cfg.model, data_spec(cfg, None), 0)
        run = bare_run(model, cfg, Accelerator(cpu=True))
        assert offloads(run.model.module) == cfg.train.activation_offload
        if hooks is not None:
            assert offload_checkpoints(run.model.module, hooks)
        batch = _batch(model, "codec_lm", TOKENS)
        losses = [train_step(run, [dict(batch, audio_seconds=1.0)]).loss for _ in range(steps)]
        weights = {n: p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach().clone()
                   for n, p in run.model.module.named_parameters() if p.requires_grad}
        return weights, losses, int(batch["attention_mask"].sum())
    finally:
        AcceleratorState._reset_state()
        if own_group and dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_layer_inputs_go_out_and_back_and_training_is_bit_equal(strategy: str) -> None:
    """HostCopies does what a GPU's offload does (a copy out at the pack, a new copy back at the unpack): the
    weights and losses after 3 steps with dropout equal those without offload, to the bit; exactly the layer
    inputs passed through the hooks (layers x tokens x hidden x 4 bytes per step, fp32), and all came back."""
    plain, plain_losses, _ = _train([*BASE, *STRATEGIES[strategy]], None)
    hooks = HostCopies()
    offloaded, losses, tokens = _train([*BASE, *STRATEGIES[strategy], "train.activation_offload=true"], hooks)
    assert losses == plain_losses
    assert offloaded.keys() == plain.keys()
    assert all(torch.equal(offloaded[n], plain[n]) for n in plain), [n for n in plain
                                                                     if not torch.equal(offloaded[n], plain[n])]
    assert hooks.packed_bytes == 3 * LAYERS * tokens * H * 4
    assert hooks.unpacked_bytes == hooks.packed_bytes


def test_on_cpu_the_host_is_the_device_and_pinning_needs_cuda() -> None:
    assert pin_host_memory() == torch.cuda.is_available()
    hooks = ActivationOffload(pin_memory=pin_host_memory())
    x = torch.randn(4, 5)
    assert hooks.to_host(x) is x  # already in host memory: nothing moves
    assert hooks.to_device(x, x.device) is x
    with hooks:  # a saved tensor goes through both hooks and comes back equal
        y = torch.randn(3, requires_grad=True)
        (y * y).sum().backward()
    assert torch.equal(y.grad, 2 * y.detach())
    assert hooks.packed_bytes == hooks.unpacked_bytes == 2 * 3 * 4  # y saved twice by the multiplication


def test_offload_needs_checkpointing_and_is_refused_where_it_cannot_work(monkeypatch, capsys) -> None:
    from voxrelay.cli import demo_config_path, main

    with pytest.raises(ConfigError, match=r"activation_offload=true .* needs train.gradient_checkpointing=true"):
        load_config(None, ["train.activation_offload=true"])
    monkeypatch.setattr(sys, "argv", ["voxrelay", "config", "show", str(demo_config_path()),
                                      "train.activation_offload=true"])
    with pytest.raises(SystemExit) as stop:
        main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "train.gradient_checkpointing=true" in err and "Traceback" not in err, err
    # how memory is laid out, not what is trained: it may change when a run resumes
    saved = load_config(None, []).to_dict()
    now = load_config(None, ["train.gradient_checkpointing=true", "train.activation_offload=true"]).to_dict()
    assert config_changes(saved, now) == (["train.activation_offload", "train.gradient_checkpointing"], [])
    # a model whose layers checkpoint without transformers' checkpoint function has nothing to offload
    assert offload_checkpoints(torch.nn.Sequential(torch.nn.Linear(2, 2)), ActivationOffload(False)) == 0


def test_accelerates_activation_checkpointing_offload_is_this_key() -> None:
    from tests.unit.train.test_fsdp_strategy import SEED_001
    from voxrelay.train.launch_env import accelerate_settings, apply_accelerate_env

    env = SEED_001 | {"FSDP_ACTIVATION_CHECKPOINTING": "true", "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD": "true"}
    wanted, _, not_applied = accelerate_settings(env)
    assert wanted["activation_offload"] is True and not any("OFFLOAD" in k for k in not_applied), not_applied
    cfg = apply_accelerate_env(load_config(None, []), dict(env))
    assert (cfg.train.gradient_checkpointing, cfg.train.activation_offload) == (True, True)
    with pytest.raises(ConfigError, match="activation_offload"):  # accelerate's offload without its checkpointing
        apply_accelerate_env(load_config(None, []), SEED_001 | {"FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD": "true"})


def test_plan_moves_the_layer_inputs_from_the_gpu_to_the_host() -> None:
    from voxrelay.plan import compute_mode, configured, offloaded_host_bytes, per_gpu, strategies
    from voxrelay.plan.fit import overrides
    from voxrelay.plan.model import model_facts

    cfg = load_config(None, [*BASE[:-1], "train.precision=bf16", "train.gradient_checkpointing=true",
                             "train.activation_offload=true", "train.chunked_loss=false"])  # the loss the peak
    facts, _ = model_facts(cfg, None)
    st = configured(cfg, 1)
    on, off = st, dataclasses.replace(st, activation_offload=False)
    tokens, compute = 4096, compute_mode(cfg, "ddp")
    moved = offloaded_host_bytes(facts, on, tokens, compute)
    assert moved == LAYERS * tokens * H * 4  # fp32 residual stream under autocast
    assert offloaded_host_bytes(facts, off, tokens, compute) == 0
    a, b = per_gpu(facts, on, tokens, compute), per_gpu(facts, off, tokens, compute)
    assert (a["peak_phase"], b["peak_phase"]) == ("loss", "loss")
    # at the loss every layer input is on the host; while a layer is recomputed its own input is back
    assert (b["total"] - b["overhead"]) - (a["total"] - a["overhead"]) == moved
    assert b["activations"] - a["activations"] == moved - tokens * H * 4
    assert on in strategies(1, "adamw") and dataclasses.replace(on, lora=True) in strategies(1, "adamw")
    assert on.name == "ddpx1 full grad-ckpt act-offload adamw"
    assert overrides(on, load_config(None, [])) == "train.gradient_checkpointing=true train.activation_offload=true"
    # and the host holds them: the plan's host RAM of the row grows by exactly what left the GPU
    from voxrelay.plan import Lengths, make_plan

    rows = {r.strategy: r for r in make_plan(cfg, facts, Lengths(tokens, "test"), 1, 80 * 10**9).rows}
    full = dataclasses.replace(on, lora=False)
    assert rows[full].host_bytes["activations"] == moved
    assert rows[full].host_bytes["total"] - rows[dataclasses.replace(full, activation_offload=False)].host_bytes[
        "total"] == moved
