"""train.optimizer and train.schedule: exact resume of every optimizer through a checkpoint's
state dicts, each schedule's lr curve against transformers' schedule of the same name (and the schedules of
before against values computed by hand), and no weight decay on norms and biases whatever the optimizer."""

from __future__ import annotations

import io
import math
import sys
from typing import get_args

import pytest
import torch

from voxrelay.config import ConfigError, TrainConfig, load_config
from voxrelay.errors import UserError
from voxrelay.models.base import decay_groups
from voxrelay.train.optim import OPTIMIZERS, build_optimizer, build_scheduler, lr_lambda

OPTIMIZER_NAMES = get_args(TrainConfig.model_fields["optimizer"].annotation)
STEPS = 8


def _tc(*overrides: str) -> TrainConfig:
    return load_config(None, ["train.max_steps=8", "train.warmup_steps=2", "train.weight_decay=0.1",
                              *overrides]).train


def _module(seed: int = 0) -> torch.nn.Module:
    # the first matrix has 8192 elements, above bitsandbytes' min_8bit_size (4096): its states are 8-bit
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128), torch.nn.GELU(),
                               torch.nn.Linear(128, 4))


def _built(tc: TrainConfig, module: torch.nn.Module):
    optimizer = build_optimizer(tc, decay_groups(module, tc.weight_decay))
    return optimizer, build_scheduler(tc, optimizer)


def _train(module, optimizer, scheduler, steps: range) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(step)  # the batch of a step depends on the step only
        x, y = torch.randn(16, 64, generator=g), torch.randn(16, 4, generator=g)
        torch.nn.functional.mse_loss(module(x), y).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)


def _through_checkpoint(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _resumed(tc: TrainConfig, load_state: bool) -> torch.nn.Module:
    module = _module()
    optimizer, scheduler = _built(tc, module)
    _train(module, optimizer, scheduler, range(STEPS // 2))
    saved = _through_checkpoint({"model": module.state_dict(), "optimizer": optimizer.state_dict(),
                                 "scheduler": scheduler.state_dict()})
    module = _module(seed=1)  # a new process: other initial weights, replaced by the checkpoint's
    module.load_state_dict(saved["model"])
    optimizer, scheduler = _built(tc, module)
    if load_state:
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
    _train(module, optimizer, scheduler, range(STEPS // 2, STEPS))
    return module


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_resume_through_state_dicts_is_exact(name):
    tc = _tc(f"train.optimizer={name}")
    straight = _module()
    _train(straight, *_built(tc, straight), range(STEPS))
    resumed = _resumed(tc, load_state=True)
    for (key, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name}: {key} differs after resume"
    # the comparison can fail: without the optimizer and scheduler state the weights differ
    forgot = _resumed(tc, load_state=False)
    assert not all(torch.equal(a, b) for a, b in zip(straight.state_dict().values(), forgot.state_dict().values(),
                                                      strict=True))


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_norms_and_biases_get_no_weight_decay(name):
    tc = _tc(f"train.optimizer={name}", "train.lr=0.5", "train.warmup_steps=0")  # HF's warmup: lr 0 at step 0
    module = _module()
    optimizer, _ = _built(tc, module)
    decayed, kept = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and kept["weight_decay"] == 0.0
    assert {id(p) for p in kept["params"]} == {id(p) for n, p in module.named_parameters() if p.ndim == 1}
    # with zero gradients only weight decay moves a parameter: matrices shrink, 1-d parameters stay
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for n, p in module.named_parameters():
        if p.ndim == 1:
            assert torch.equal(p, before[n]), f"{name}: {n} was decayed"
        else:
            expected = before[n] * (1 - tc.lr * lr_lambda(tc)(0) * 0.1)
            assert torch.allclose(p, expected, rtol=1e-5, atol=1e-6), f"{name}: {n} not decayed by lr x wd"


def test_default_is_the_adamw_runs_had_before_the_option():
    optimizer, _ = _built(TrainConfig(), _module())
    assert type(optimizer) is torch.optim.AdamW
    group = optimizer.param_groups[0]
    assert (group["initial_lr"], group["betas"], group["eps"], group["weight_decay"], group["amsgrad"]) == (
        1e-3, (0.9, 0.95), 1e-8, 0.01, False)


def test_adamw_is_fused_where_its_parameters_live_on_a_gpu(monkeypatch):
    """The fused kernel on a GPU host (as a HF Trainer's default), not with CPU offload, not on a CPU host (where
    the default implementation keeps the demo's numbers); exact resume holds for it (the test above, on CPU)."""
    assert _built(TrainConfig(), _module())[0].param_groups[0]["fused"] is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _built(TrainConfig(), _module())[0].param_groups[0]["fused"] is True
    offload = _tc("train.strategy=fsdp", "train.cpu_offload=true")
    assert _built(offload, _module())[0].param_groups[0]["fused"] is None


@pytest.mark.parametrize("name", ["adamw", "adamw_8bit"])
def test_betas_and_eps_reach_adam(name):
    optimizer, _ = _built(_tc(f"train.optimizer={name}", "train.betas=[0.8, 0.99]", "train.eps=1e-6"), _module())
    assert all((g["betas"], g["eps"]) == ((0.8, 0.99), 1e-6) for g in optimizer.param_groups)


def test_lion_steps_as_worked_by_hand():
    """Lion's update on numbers worked by hand: sign of the interpolated momentum, decoupled decay, then the
    momentum (two steps, lr 0.1, betas (0.9, 0.99), weight_decay 0.1)."""
    from voxrelay.train.lion import Lion

    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    optimizer = Lion([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.1)
    for grad in ([0.5, -1.0, 0.0], [-1.0, -1.0, 1.0]):
        p.grad = torch.tensor(grad)
        optimizer.step()
        if grad[0] == 0.5:  # after step 1: c = 0.1 g -> sign (1, -1, 0); m = 0.01 g
            assert torch.allclose(p, torch.tensor([0.89, -1.88, 0.495]))
            assert torch.allclose(optimizer.state[p]["exp_avg"], torch.tensor([0.005, -0.01, 0.0]))
    # step 2: c = 0.9 m + 0.1 g = (-0.0955, -0.109, 0.1) -> sign (-1, -1, 1)
    assert torch.allclose(p, torch.tensor([0.89 * 0.99 + 0.1, -1.88 * 0.99 + 0.1, 0.495 * 0.99 - 0.1]))


def test_lion_8bit_follows_lion():
    """bitsandbytes' Lion8bit takes the same steps as Lion up to its 8-bit momentum: after 8 steps on the same
    batches the weights are close (and both moved)."""
    tc = _tc("train.optimizer=lion", "train.lr=0.01")
    a, b = _module(), _module()
    _train(a, *_built(tc, a), range(STEPS))
    _train(b, *_built(_tc("train.optimizer=lion_8bit", "train.lr=0.01"), b), range(STEPS))
    start = _module()
    for (name, wa), wb, w0 in zip(a.state_dict().items(), b.state_dict().values(), start.state_dict().values(),
                                  strict=True):
        moved = (wa - w0).abs().mean()
        assert moved > 1e-3 and (wa - wb).abs().mean() < 0.25 * moved, name


def test_adafactor_uses_our_lr_and_schedule():
    tc = _tc("train.optimizer=adafactor", "train.betas=[0.8, 0.9]", "train.warmup_from_zero=false")
    optimizer, _ = _built(tc, _module())
    group = optimizer.param_groups[0]
    assert (group["relative_step"], group["scale_parameter"], group["warmup_init"], group["beta1"]) == (
        False, False, False, None)
    assert group["lr"] == pytest.approx(tc.lr / 3)  # warmup step 0 of 2: 1/3 of lr


def test_8bit_without_bitsandbytes_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` raises ImportError
    with pytest.raises(ConfigError) as info:
        _built(_tc("train.optimizer=adamw_8bit"), _module())
    assert isinstance(info.value, UserError)
    assert "pip install 'voxrelay[bnb]'" in str(info.value) and "train.optimizer=adamw" in str(info.value)


def test_every_configurable_optimizer_is_built():
    assert set(OPTIMIZERS) == set(OPTIMIZER_NAMES)


def _lrs(schedule: str, steps: list[int], *overrides: str) -> list[float]:
    """lr at each of ``steps`` (0-based optimizer steps) with lr=1, warmup 4, max_steps 14."""
    tc = load_config(None, [f"train.schedule={schedule}", "train.lr=1", "train.warmup_steps=4",
                            "train.max_steps=14", *overrides]).train
    return _stepped(build_scheduler(tc, _sgd()), steps)


def _sgd() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)


def _stepped(scheduler, steps: list[int]) -> list[float]:
    out = []
    for step in range(max(steps) + 1):
        if step in steps:
            out.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return out


SCHEDULES = get_args(TrainConfig.model_fields["schedule"].annotation)
EVERY_STEP = list(range(15))  # 0 .. max_steps


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_each_schedule_is_its_transformers_namesake(schedule):
    """Named as HF's get_scheduler, equal to it at every step of the run, to the last bit (issue 32 item 7)."""
    from transformers import get_scheduler

    theirs = get_scheduler(schedule, _sgd(), num_warmup_steps=4, num_training_steps=14)
    assert _lrs(schedule, EVERY_STEP) == _stepped(theirs, EVERY_STEP)


def test_cosine_with_a_floor_is_transformers_cosine_with_min_lr():
    from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

    theirs = get_cosine_with_min_lr_schedule_with_warmup(_sgd(), 4, 14, min_lr_rate=0.1)
    assert _lrs("cosine", EVERY_STEP, "train.min_lr_ratio=0.1") == pytest.approx(_stepped(theirs, EVERY_STEP),
                                                                               rel=1e-15)


STEPS_CHECKED = [0, 3, 4, 6, 9, 14, 20]  # warmup, its last step, peak, early decay, mid, end, past the end
BEFORE = ["train.min_lr_ratio=0.1", "train.warmup_from_zero=false"]  # the schedules voxrelay had before


@pytest.mark.parametrize(("schedule", "expected"), [
    # warmup (step + 1) / 5; decay progress (step - 4) / 10: 0.2 at step 6, 0.5 at step 9; floor 0.1
    ("cosine", [0.2, 0.8, 1.0, 0.1 + 0.45 * (1 + math.cos(0.2 * math.pi)), 0.55, 0.1, 0.1]),
    ("linear", [0.2, 0.8, 1.0, 0.1 + 0.9 * 0.8, 0.55, 0.1, 0.1]),
    ("constant", [1.0] * 7),
    ("constant_with_warmup", [0.2, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0]),
])
def test_the_schedules_of_before_by_hand(schedule, expected):
    assert _lrs(schedule, STEPS_CHECKED, *BEFORE) == pytest.approx(expected, rel=1e-12)


def test_a_run_saved_before_the_change_keeps_its_schedule():
    """A checkpoint's config from before: min_lr_ratio 0.1 (its default then), no warmup_from_zero. Resumed by a
    config that sets neither, the run keeps both; a key this session sets is not overridden."""
    from voxrelay.config import config_changes
    from voxrelay.train.optim import started_schedule

    saved = load_config(None, ["train.min_lr_ratio=0.1"]).to_dict()
    del saved["train"]["warmup_from_zero"]
    cfg = load_config(None, [])
    kept = started_schedule(cfg.train, saved)
    assert kept == {"min_lr_ratio": 0.1, "warmup_from_zero": False}
    cfg.train = cfg.train.model_copy(update=kept)
    assert config_changes(saved, cfg.to_dict()) == ([], [])  # the resume check finds nothing changed
    assert started_schedule(load_config(None, ["train.min_lr_ratio=0"]).train, saved) == {"warmup_from_zero": False}
    assert started_schedule(cfg.train, cfg.to_dict()) == {}  # a run saved by this version: nothing to keep


def test_constant_warns_that_warmup_is_unused(caplog):
    with caplog.at_level("WARNING", logger="voxrelay.train.optim"):
        _lrs("constant", [0])
    assert "constant_with_warmup" in caplog.text


def test_decay_norms_and_biases_gives_the_one_group_optimizer_of_before() -> None:
    from tests.unit.models.test_family import tiny
    from voxrelay.train.build import optimizer_groups

    model = tiny()
    (group,) = optimizer_groups(model, TrainConfig(decay_norms_and_biases=True, weight_decay=0.05))
    assert [id(p) for p in group["params"]] == [id(p) for p in model.module.parameters()]  # module order, all
    assert group["weight_decay"] == 0.05
    decay, no_decay = optimizer_groups(model, TrainConfig(weight_decay=0.05))
    assert no_decay["weight_decay"] == 0.0 and no_decay["params"] and len(decay["params"]) + len(
        no_decay["params"]) == len(group["params"])


def test_the_demo_keeps_decaying_norms() -> None:
    from voxrelay.cli import demo_config_path
    from voxrelay.config import load_config

    assert load_config(demo_config_path()).train.decay_norms_and_biases  # its numbers stay those it always gave
