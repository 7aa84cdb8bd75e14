"""Exact resumption: a run killed (SIGKILL) at any moment and resumed ends with weights equal,
tensor for tensor, to an uninterrupted run; also with 2 gloo DDP processes, and 2 -> 1 processes."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.integration.runner import (
    CONFIG,
    Trainer,
    assert_same_weights,
    env_for,
    final_weights,
    torchrun,
    voxrelay,
)
from tests.integration.tiny import tiny
from voxrelay import storage
from voxrelay.checkpoint.manager import STATE_FILE, CheckpointManager, load_state

STEPS = 12


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A local root with the tiny prepared corpus (shared by the tests of this module)."""
    base = tmp_path_factory.mktemp("resume")
    env = env_for(base / "cache")
    res = voxrelay("prepare", CONFIG, *tiny(str(base / "root")), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return base


def _train(base: Path, name: str, *extra: str, nproc: int = 1, cache: str = "cache"):
    args = ("train", CONFIG, *tiny(str(base / "root"), f"name={name}", f"train.max_steps={STEPS}",
                                    "train.eval_every=100", *extra))
    env = env_for(base / cache)
    res = torchrun(nproc, *args, env=env) if nproc > 1 else voxrelay(*args, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def _weights(base: Path, name: str, cache: str = "cache"):
    return final_weights(str(base / "root" / "runs" / name), base / cache / "fetch")


def _cursor(base: Path, name: str, step: int) -> dict:
    mgr = CheckpointManager(str(base / "root" / "runs" / name), staging_dir=base / "cache" / "fetch")
    _, folder = mgr.latest_valid(step)
    return load_state(folder / STATE_FILE)["data"]


def test_kill_and_resume_is_bit_exact(prepared):
    _train(prepared, "straight")
    # the same run, killed with SIGKILL right after the checkpoint of step 4 is committed
    trainer = Trainer(str(prepared / "root"), env_for(prepared / "cache"), "name=killed",
                      f"train.max_steps={STEPS}", "train.eval_every=100")
    manifest = prepared / "root/runs/killed/checkpoints/step-00000004/manifest.json"
    deadline = time.time() + 120
    while not manifest.exists() and time.time() < deadline and trainer.proc.poll() is None:
        time.sleep(0.01)
    trainer.proc.send_signal(signal.SIGKILL)
    trainer.proc.wait()
    assert manifest.exists(), trainer.output()
    res = _train(prepared, "killed")
    assert "resuming" in res.stderr
    step_a, a = _weights(prepared, "straight")
    step_b, b = _weights(prepared, "killed")
    assert step_a == step_b == STEPS
    assert_same_weights(a, b)


def test_config_changes_on_resume(prepared):
    _train(prepared, "cfg", f"train.max_steps={STEPS // 2}")
    res = voxrelay("train", CONFIG, *tiny(str(prepared / "root"), "name=cfg", "model.hidden_size=64"),
                   env=env_for(prepared / "cache"))
    assert res.returncode == 2
    assert "incompatible changes: model.hidden_size" in res.stderr and "--fresh" in res.stderr
    res = _train(prepared, "cfg", "model.hidden_size=64", "--fresh")
    assert "resuming" not in res.stderr
    lines = [json.loads(x) for x in (prepared / "root/runs/cfg/metrics.jsonl").read_text().splitlines()]
    assert lines[0]["step"] == 0 and lines[-1]["step"] == STEPS  # old metrics went with --fresh
    assert _weights(prepared, "cfg")[1]["model.embed_tokens.weight"].shape[1] == 64


def test_ddp_two_processes_resume_exactly(prepared):
    # constant lr: raising max_steps on resume (allowed) would otherwise stretch the cosine schedule
    _train(prepared, "ddp-straight", "train.schedule=constant", nproc=2)
    _train(prepared, "ddp-split", "train.schedule=constant", f"train.max_steps={STEPS // 2}", nproc=2)
    res = _train(prepared, "ddp-split", "train.schedule=constant", nproc=2)
    assert "resuming" in res.stderr
    assert_same_weights(_weights(prepared, "ddp-straight")[1], _weights(prepared, "ddp-split")[1])


def test_two_to_one_process_resume_continues_at_the_same_sample(prepared):
    _train(prepared, "ddp-shrink", "train.max_steps=4", nproc=2)
    at_4 = _cursor(prepared, "ddp-shrink", 4)
    _train(prepared, "ddp-shrink", "train.max_steps=7")
    # the expected cursors, from the batch plan alone: 4 steps of 2 processes, then 3 steps of 1
    stream = _stream(prepared, world=2)
    it = iter(stream)
    consumed = [next(it) for _ in range(4)]
    assert at_4 == stream.state_dict()
    single = _stream(prepared, world=1)
    single.load_state_dict(stream.state_dict())
    it = iter(single)
    consumed += [next(it) for _ in range(3)]
    assert _cursor(prepared, "ddp-shrink", 7) == single.state_dict()
    # rank 0's batches of the 2-process steps, then the 1-process ones: the global order, with
    # rank 1's batches in between; nothing skipped or repeated
    reference = iter(_stream(prepared, world=1))
    flat = [next(reference) for _ in range(11)]
    assert consumed == flat[0:8:2] + flat[8:11]


def _stream(base: Path, world: int):
    from voxrelay.config import load_config
    from voxrelay.data.loader import PreparedDataset
    from voxrelay.models.codec_lm.model import CodecLM
    from voxrelay.train.build import build_stream

    cfg = load_config(CONFIG, tiny(str(base / "root")))
    rows = PreparedDataset.open(cfg.prepared_uri, "train").rows
    model = CodecLM.build(cfg.model, cfg.codec.num_codebooks, cfg.codec.codebook_size, [], 0)
    stream = build_stream(model, rows, cfg, 0, world)
    stream.make_batch = lambda ids: tuple(ids)  # batch identity instead of tensors
    return stream


def test_chaos_sigkill_at_random_moments(prepared, s3_root):
    """SIGKILL `voxrelay train` (root on the S3 server) at random moments — while it starts and
    loads, trains, stages, uploads and writes manifests (a checkpoint every step) — at least 10
    times, then let it finish: the weights equal those of a run that was never interrupted."""
    env = env_for(prepared / "cache-chaos")
    env |= {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    steps = 50
    args = (f"train.max_steps={steps}", "train.eval_every=1000", "checkpoint.every_steps=1", "train.log_every=1")
    for cmd, extra in (("prepare", ()), ("train", ("name=reference", *args))):
        res = voxrelay(cmd, CONFIG, *tiny(s3_root, *extra), env=env)
        assert res.returncode == 0, res.stdout + res.stderr
    rng = random.Random(1234)
    kills, finished, log = 0, False, []
    while kills < 12 and not finished:
        trainer = Trainer(s3_root, env, "name=chaos", *args)
        if rng.random() < 0.2:  # during start-up: imports, finding and verifying the checkpoint
            time.sleep(rng.uniform(0.5, 4.0))
        else:
            assert trainer.first_step.wait(120), trainer.output()
            time.sleep(rng.uniform(0.0, 0.3))
        if trainer.proc.poll() is not None:
            assert trainer.proc.returncode == 0, trainer.output()
            finished = True
            break
        trainer.proc.send_signal(signal.SIGKILL)
        trainer.proc.wait()
        kills += 1
        log.append(_last_step_line(trainer))
    if not finished:
        res = voxrelay("train", CONFIG, *tiny(s3_root, "name=chaos", *args), env=env)
        assert res.returncode == 0, res.stdout + res.stderr
    assert kills >= 10, log
    staging = prepared / "cache-chaos" / "fetch"
    step_a, a = final_weights(storage.join(s3_root, "runs", "reference"), staging)
    step_b, b = final_weights(storage.join(s3_root, "runs", "chaos"), staging)
    assert step_a == step_b == steps
    assert_same_weights(a, b)
    print(f"chaos: survived {kills} SIGKILLs; killed after: {log}")


def _last_step_line(trainer: Trainer) -> str:
    steps = [line.split("|")[0].strip() for line in trainer.lines if line.startswith("step ")]
    return steps[-1] if steps else "start-up"
