"""A NaN/inf loss or gradient norm never reaches the weights: the optimizer step is skipped (weights,
optimizer and scheduler unchanged), counted, and after train.max_bad_steps in a row the run saves
and stops with its own exit code. The NaN is injected deterministically with a forward hook."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.runner import CONFIG
from tests.helpers.tiny import NO_EVALS, NO_SAVES, tiny
from voxrelay.checkpoint.stops import EXIT_NON_FINITE

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # tiers: see tests/conftest.py


SETTINGS = ("train.max_bad_steps=3", "train.max_steps=50", NO_EVALS, NO_SAVES, "train.log_every=1",
            "train.eval_synth=0")  # the hook would poison eval sampling too


def _config(root: Path):
    from voxrelay.config import load_config

    return load_config(CONFIG, tiny(str(root), *SETTINGS))


@pytest.fixture
def run(tiny_prepared):
    from voxrelay.train.build import build_run

    run = build_run(tiny_prepared(*SETTINGS))
    yield run
    run.close(5)


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


def _inf_gradients(run):
    """A finite loss whose gradients are infinite: every gradient of the output head's weight becomes inf."""
    weight = next(p for n, p in run.model.module.named_parameters() if p.requires_grad and p.ndim == 2)
    return weight.register_hook(lambda g: torch.full_like(g, float("inf")))


def _snapshot(run) -> tuple[dict, dict, dict]:
    return (copy.deepcopy(run.model.module.state_dict()), copy.deepcopy(run.optimizer.state_dict()),
            copy.deepcopy(run.scheduler.state_dict()))


def _unchanged(run, before) -> bool:
    weights, opt_state, sched_state = before
    same_weights = all(torch.equal(v, weights[k]) for k, v in run.model.module.state_dict().items())
    same_opt = all(torch.equal(v, opt_state["state"][pid][name])
                   for pid, state in run.optimizer.state_dict()["state"].items() for name, v in state.items())
    return same_weights and same_opt and run.scheduler.state_dict() == sched_state


def test_a_finite_loss_with_an_infinite_gradient_norm_is_skipped_too(run):
    from voxrelay.train.loop import train_step

    batches = iter(run.stream)
    assert train_step(run, [next(batches)]).finite
    before = _snapshot(run)
    handle = _inf_gradients(run)
    stats = train_step(run, [next(batches)])
    handle.remove()
    assert stats.loss == stats.loss and abs(stats.loss) != float("inf")  # the loss itself was finite
    assert not stats.finite and stats.grad_norm == float("inf") and not stats.scaler_skipped
    assert _unchanged(run, before)


def _with_cpu_grad_scaler(run, init_scale: float = 2.0**10):
    """fp16's loss scaling on this CPU: a real torch GradScaler in accelerate's optimizer wrapper and backward, as
    accelerate sets them up for fp16 on a GPU (on a CPU it makes none)."""
    from accelerate.optimizer import AcceleratedOptimizer

    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    acc = run.accelerator
    acc._optimizers.remove(run.optimizer)
    run.optimizer = AcceleratedOptimizer(run.optimizer.optimizer, device_placement=False, scaler=scaler)
    acc._optimizers.append(run.optimizer)
    acc.scaler = scaler
    return scaler


def test_fp16_scaler_skips_are_the_scalers_not_bad_steps_and_the_schedule_waits(run):
    from voxrelay.train.loop import train, train_step

    scaler = _with_cpu_grad_scaler(run)
    batches = iter(run.stream)
    assert train_step(run, [next(batches)]).finite and scaler.get_scale() == 2.0**10
    before = _snapshot(run)
    handle = _inf_gradients(run)
    stats = train_step(run, [next(batches)])
    assert stats.finite and stats.scaler_skipped  # the scaler's business: not a non-finite step
    assert scaler.get_scale() == 2.0**9 and _unchanged(run, before)  # scale halved; no update, no schedule step
    run.loop.step = 1
    run.stream.load_state_dict(run.stream.state_dict())
    run.cfg.train.max_steps = 5
    result = train(run)  # the loop: 4 steps, every one skipped by the scaler
    handle.remove()
    assert result.exit_code == 0 and run.loop.step == 5
    assert run.loop.bad_steps == 0 and run.loop.scaler_skips == 4  # counted once, as the scaler's
    assert scaler.get_scale() == 2.0**5 and _unchanged(run, before)
    lines = [json.loads(x) for x in (run.local_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["scaler_skips"] for m in lines if "scaler_skips" in m][-1] == 4


def test_one_bad_process_of_two_makes_both_skip_and_their_weights_stay_equal(tmp_path, tiny_prepared):
    """Two processes (torchrun, gloo DDP): rank 1's gradients are infinite, rank 0's are fine. Both skip the step
    (a process stepping alone would leave the replicas apart), both count it, and the weights of both are those
    of before the step; the next good step changes both alike."""
    tiny_prepared(*SETTINGS)
    root = str(Path(__file__).resolve().parents[3])  # the worker imports tests.*
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get(
        "PYTHONPATH")])))
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          __file__, str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    out = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in out:
        assert rank["finite"] == [True, False, True]  # the bad step was skipped on both, not only on rank 1
        assert rank["unchanged_by_bad_step"] and rank["bad_steps"] == 1
    assert out[0]["weights"] == out[1]["weights"]  # replicas equal after the skip and the next good step


def _worker(tmp: Path) -> None:
    import hashlib

    from voxrelay.train.build import build_run
    from voxrelay.train.loop import train_step

    run = build_run(_config(tmp / "root"))
    rank = run.accelerator.process_index
    batches = iter(run.stream)
    finite = [train_step(run, [next(batches)]).finite]
    before = _snapshot(run)
    handle = _inf_gradients(run) if rank == 1 else None
    stats = train_step(run, [next(batches)])
    run.loop.advance(stats.tokens, stats.audio_seconds, 0.0, stats.finite)
    finite.append(stats.finite)
    unchanged = _unchanged(run, before)
    if handle is not None:
        handle.remove()
    finite.append(train_step(run, [next(batches)]).finite)
    digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in run.model.module.state_dict().values()))
    (tmp / f"rank{rank}.json").write_text(json.dumps({"finite": finite, "unchanged_by_bad_step": unchanged,
                                                      "bad_steps": run.loop.bad_steps, "weights": digest.hexdigest()}))
    run.close(5)
    run.exit(0)


if __name__ == "__main__":
    os.environ.setdefault("VOXRELAY_CACHE", str(Path(sys.argv[1]) / "cache"))
    _worker(Path(sys.argv[1]))
