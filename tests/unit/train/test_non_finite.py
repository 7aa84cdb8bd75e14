"""A NaN/inf loss or gradient norm never reaches the weights: the optimizer step is skipped (weights,
optimizer and scheduler unchanged), counted, and after train.max_bad_steps in a row the run saves
and stops with its own exit code. The NaN is injected deterministically with a forward hook."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from tests.integration.runner import CONFIG
from tests.integration.tiny import tiny
from voxrelay.checkpoint.preemption import EXIT_NON_FINITE


@pytest.fixture
def run(tmp_path, monkeypatch):
    from voxrelay.config import load_config
    from voxrelay.data.prepare import prepare
    from voxrelay.train.build import build_run

    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    cfg = load_config(CONFIG, tiny(str(tmp_path / "root"), "train.max_bad_steps=3", "train.max_steps=50",
                                   "train.eval_every=1000", "checkpoint.every_steps=1000", "train.log_every=1",
                                   "train.eval_synth=0"))  # the hook would poison eval sampling too
    prepare(cfg)
    run = build_run(cfg)
    yield run
    run.checkpoints.close(5)


def _poison(run):
    """Every forward pass of the embeddings returns NaN from now on."""
    emb = run.model.module.get_input_embeddings()
    return emb.register_forward_hook(lambda _m, _i, out: out * float("nan"))


def test_non_finite_step_changes_nothing(run):
    from voxrelay.train.loop import train_step

    batches = iter(run.stream)
    assert train_step(run, [next(batches)]).finite  # one good step: the optimizer has state now
    weights = copy.deepcopy(run.model.module.state_dict())
    opt_state = copy.deepcopy(run.optimizer.state_dict())
    sched_state = copy.deepcopy(run.scheduler.state_dict())
    handle = _poison(run)
    stats = train_step(run, [next(batches)])
    handle.remove()
    assert not stats.finite
    for key, value in run.model.module.state_dict().items():
        assert torch.equal(value, weights[key]), key
    for pid, state in run.optimizer.state_dict()["state"].items():
        for name, value in state.items():
            assert torch.equal(value, opt_state["state"][pid][name]), (pid, name)
    assert run.scheduler.state_dict() == sched_state
    assert all(p.grad is None for p in run.model.module.parameters())  # nothing left for the next step
    assert train_step(run, [next(batches)]).finite  # and training goes on once the data is good again
    changed = [k for k, v in run.model.module.state_dict().items() if not torch.equal(v, weights[k])]
    assert changed


def test_too_many_bad_steps_in_a_row_save_and_stop(run):
    from voxrelay.train.loop import NON_FINITE, train, train_step

    batches = iter(run.stream)
    train_step(run, [next(batches)])
    good = copy.deepcopy(run.model.module.state_dict())
    run.stream.load_state_dict(run.stream.state_dict())  # the loop starts its own iterator at the cursor
    _poison(run)
    result = train(run)
    assert result.exit_code == EXIT_NON_FINITE and result.stop_reason == NON_FINITE
    assert result.step == 3 and result.durable  # steps 1, 2, 3 were all bad: stopped at the third
    assert run.loop.bad_steps == 3 and run.loop.bad_in_a_row == 3
    ckpt, weights, _ = run.checkpoints.load_model()
    assert ckpt.step == 3
    for key, value in weights.items():  # the saved weights are the last good ones
        assert torch.equal(value, good[key]), key
    lines = [json.loads(x) for x in (run.local_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["bad_steps"] for m in lines if "bad_steps" in m] == [1, 2, 3]
