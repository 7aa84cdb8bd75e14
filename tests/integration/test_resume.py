"""Exact resumption: a run killed (SIGKILL) at any moment and resumed ends with weights equal,
tensor for tensor, to an uninterrupted run; also with 2 gloo DDP processes (killed while its newest
checkpoint is staged on local disk only), and 2 -> 1 processes; also with LoRA adapters (a frozen
base, checkpoints holding the trained tensors only).

The runs use dropout (``model.dropout``, and ``train.lora.dropout`` with LoRA), so every step draws
from the torch RNG: a resume that did not restore the RNG state of each process would train on other
dropout masks and end with other weights.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.prepared import copy_corpus
from tests.helpers.proxy import TcpProxy, s3_env_through
from tests.helpers.runner import (
    CONFIG,
    FAST_FAIL,
    Trainer,
    assert_same_weights,
    env_for,
    final_weights,
    staged_steps,
    staging_dir,
    torchrun,
    voxrelay,
)
from tests.helpers.tiny import tiny
from voxrelay import storage
from voxrelay.checkpoint.manager import STATE_FILE, CheckpointManager, load_state
from voxrelay.checkpoint.store import MANIFEST, CommittedStore, parse_step, read_local_manifest, step_name

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # tiers: see tests/conftest.py

STEPS = 12
DROPOUT = "model.dropout=0.1"  # the steps draw from the RNG (see the module docstring)
LORA = ("train.lora.r=4", "train.lora.dropout=0.1")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, shared_tmp):
    """A local root with the tiny prepared corpus (shared by the tests of this module)."""
    return copy_corpus(shared_tmp, tmp_path_factory.mktemp("resume"))


def _train(base: Path, name: str, *extra: str, nproc: int = 1, cache: str = "cache"):
    args = ("train", CONFIG, *tiny(str(base / "root"), f"name={name}", f"train.max_steps={STEPS}",
                                    "train.eval_every=100", DROPOUT, *extra))
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


EIGHT_BIT = ("train.optimizer=adamw_8bit",)
COMPILE = ("train.compile=true",)  # each session compiles its layers again; the runs are packed (train.packing auto)


# LoRA: SIGKILLed and resumed in test_orpheus.py (Orpheus' LoRA); LoRA and 8-bit AdamW resumed bit for bit from a
# kill right after a commit in tests/unit/train/test_plan_combinations.py
@pytest.mark.parametrize("extra", [(), COMPILE], ids=["full", "compiled"])
def test_kill_and_resume_is_bit_exact(prepared, extra):
    tag = {(): "", LORA: "-lora", EIGHT_BIT: "-8bit", COMPILE: "-compile"}[extra]
    _train(prepared, f"straight{tag}", *extra)
    # the same run, killed with SIGKILL right after the checkpoint of step 4 is committed
    trainer = Trainer(str(prepared / "root"), env_for(prepared / "cache"), f"name=killed{tag}",
                      f"train.max_steps={STEPS}", "train.eval_every=100", DROPOUT, *extra)
    manifest = prepared / f"root/runs/killed{tag}/checkpoints/step-00000004/manifest.json"
    deadline = time.time() + 300
    while not manifest.exists() and time.time() < deadline and trainer.proc.poll() is None:
        time.sleep(0.01)
    trainer.kill()
    assert manifest.exists(), trainer.output()
    res = _train(prepared, f"killed{tag}", *extra)
    resumed = _resumed_step(res.stderr)
    assert 4 <= resumed < STEPS, res.stderr  # the resumed session really trained
    step_a, a = _weights(prepared, f"straight{tag}")
    step_b, b = _weights(prepared, f"killed{tag}")
    assert step_a == step_b == STEPS
    assert_same_weights(a, b)
    # with LoRA the checkpoint holds the adapters and the modules trained in full, nothing of the frozen base
    assert all(".lora_" in k or ".modules_to_save." in k for k in a) == (extra == LORA)
    if extra == COMPILE:  # compiled, and packed: what the equality above covered
        assert "torch.compile on: 1 LlamaDecoderLayer layers" in res.stderr, res.stderr
    assert "packed batches (train.packing)" in res.stderr, res.stderr
    if extra == EIGHT_BIT:  # bitsandbytes' 8-bit states (uint8 moments of the tensors over 4096 elements) resumed
        optim = load_state(_folder(prepared, f"killed{tag}") / STATE_FILE)["optimizer"]["state"]
        dtypes = Counter(str(v.dtype) for state in optim.values() for v in _tensors(state))
        assert dtypes["torch.uint8"] >= 2, dtypes  # state1, state2 (bitsandbytes nests them in its quant state)


def _tensors(state):
    for value in state.values() if isinstance(state, dict) else ():
        yield from _tensors(value) if isinstance(value, dict) else [value] if hasattr(value, "dtype") else []


def _folder(base: Path, name: str) -> Path:
    return CheckpointManager(str(base / "root" / "runs" / name), staging_dir=base / "cache" / "fetch").latest_valid()[1]


def _resumed_step(stderr: str) -> int:
    found = re.search(r"resuming \S+ from step (\d+)", stderr)
    assert found, f"the session did not resume:\n{stderr}"
    return int(found.group(1))


def test_config_changes_on_resume(prepared):
    _train(prepared, "cfg", f"train.max_steps={STEPS // 2}")
    res = voxrelay("train", CONFIG, *tiny(str(prepared / "root"), "name=cfg", DROPOUT, "model.hidden_size=64"),
                   env=env_for(prepared / "cache"))
    assert res.returncode == 2
    said = " ".join(res.stderr.split())
    # the values, so that a run launched otherwise (accelerate's bf16/FSDP) can be resumed as it was
    assert "incompatible changes: model.hidden_size 32 -> 64" in said and "--fresh" in said, said  # tiny's 32
    assert "resume with the original values: model.hidden_size=32 " in said, said
    res = _train(prepared, "cfg", "model.hidden_size=64", "--fresh")
    assert "resuming" not in res.stderr
    lines = [json.loads(x) for x in (prepared / "root/runs/cfg/metrics.jsonl").read_text().splitlines()]
    assert lines[0]["step"] == 0 and lines[-1]["step"] == STEPS  # old metrics went with --fresh
    assert _weights(prepared, "cfg")[1]["model.embed_tokens.weight"].shape[1] == 64


# 2-process DDP resumed bit for bit: from a checkpoint only staged when SIGKILLed, in
# test_ddp_sigkill_while_the_newest_checkpoint_is_only_staged; from a committed one with LoRA, in test_vibevoice.py
# and across two nodes in test_two_nodes.py


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
    from voxrelay.data.shards import load_index
    from voxrelay.models.base import DataSpec
    from voxrelay.models.registry import build_model
    from voxrelay.train.build import build_stream
    from voxrelay.train.ranks import Ranks

    cfg = load_config(CONFIG, tiny(str(base / "root")))
    model = build_model(cfg.model, DataSpec(cfg.codec.num_codebooks, cfg.codec.codebook_size), 0)
    stream = build_stream(model, cfg, load_index(cfg.prepared_uri), 0, world, Ranks(None, 0, 1))
    stream.make_batch = lambda ids: tuple(ids)  # batch identity instead of tensors
    return stream


def test_chaos_sigkill_at_random_moments(prepared, s3_root):
    """SIGKILL `voxrelay train` (root on the S3 server) at random moments — while it starts and
    loads, trains, stages, uploads and writes manifests (a checkpoint every step) — six
    times, then let it finish: the weights equal those of a run that was never interrupted. Each
    kill's phase is read from the state it froze (:func:`_kill_phase`); several must have hit a
    checkpoint on its way to the bucket, else the test did not test what it claims."""
    cache = prepared / "cache-chaos"
    env = env_for(cache)
    env |= {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    steps = 50
    args = (f"train.max_steps={steps}", "train.eval_every=1000", "checkpoint.every_steps=1", "train.log_every=1",
            DROPOUT)
    for cmd, extra in (("prepare", ()), ("train", ("name=reference", *args))):
        res = voxrelay(cmd, CONFIG, *tiny(s3_root, *extra), env=env)
        assert res.returncode == 0, res.stdout + res.stderr
    run_uri = storage.join(s3_root, "runs", "chaos")
    staging = staging_dir(cache, run_uri)
    rng = random.Random(1234)
    # where the kills aim (shuffled): start-up (imports, finding and verifying the checkpoint), a
    # checkpoint on its way to the bucket, anywhere in a step
    plan = ["start-up", "staging", "staging", "upload", "upload", "anywhere"]
    rng.shuffle(plan)
    kills, finished, phases = 0, False, []
    for aim in plan:
        trainer = Trainer(s3_root, env, "name=chaos", *args)
        if aim == "start-up":
            time.sleep(rng.uniform(0.5, 4.0))
        else:
            assert trainer.wait_step_lines(rng.randint(1, 3), 120) or trainer.proc.poll() is not None, \
                trainer.output()
            if aim in ("staging", "upload"):
                # wait on the save itself, not a timer (hosts differ 3x): the next step's checkpoint
                # seen half-written, or just staged (its upload, ~50 ms, has then barely begun)
                _wait_for_save(trainer, staging, max(trainer.steps()) + 1, aim == "upload", timeout=120)
            else:
                time.sleep(rng.uniform(0.0, 0.3))
        if trainer.proc.poll() is not None:
            assert trainer.proc.returncode == 0, trainer.output()
            finished = True
            break
        trainer.kill()
        kills += 1
        phases.append(_kill_phase(trainer, staging, storage.join(run_uri, "checkpoints")))
    if not finished:
        res = voxrelay("train", CONFIG, *tiny(s3_root, "name=chaos", *args), env=env)
        assert res.returncode == 0, res.stdout + res.stderr
    histogram = Counter(phase for phase, _ in phases)
    print(f"chaos: survived {kills} SIGKILLs; phases {dict(histogram)}; kills: {phases}")
    assert kills >= 5, phases
    assert histogram["staging"] + histogram["upload"] + histogram["manifest"] >= 3, phases
    fetched = prepared / "cache-chaos" / "fetch"
    step_a, a = final_weights(storage.join(s3_root, "runs", "reference"), fetched)
    step_b, b = final_weights(run_uri, fetched)
    assert step_a == step_b == steps
    assert_same_weights(a, b)


def _wait_for_save(trainer: Trainer, staging: Path, step: int, staged: bool, timeout: float) -> None:
    """Return as soon as a checkpoint of ``step`` or later is being written to ``staging`` (unless
    ``staged``) or is staged (a save may be skipped when a newer one arrives first), or the trainer
    ended, or ``timeout`` passed (the phase check then tells what the kill hit)."""
    deadline = time.monotonic() + timeout
    suffix = f"-{trainer.proc.pid}"
    while trainer.proc.poll() is None and time.monotonic() < deadline:
        names = os.listdir(staging) if staging.exists() else []
        for name in names:
            partial = name.startswith(".tmp-") and name.endswith(suffix)
            if partial and staged:
                continue
            found = parse_step(name[len(".tmp-"):-len(suffix)] if partial else name)
            if found is not None and found >= step:
                return
        time.sleep(0.001)


def _kill_phase(trainer: Trainer, staging: Path, checkpoints_uri: str) -> tuple[str, int]:
    """(phase, last printed step) of a SIGKILLed single-process trainer, from what the kill froze:
    no step line yet: start-up; its own half-written staging folder: staging; a step folder in the
    bucket newer than the newest committed checkpoint with every file but no manifest: manifest;
    a staged checkpoint (or part of one in the bucket) newer than the newest committed: upload;
    else between saves: step."""
    printed = trainer.steps()
    if not printed:
        return "start-up", 0
    if list(staging.glob(f".tmp-step-*-{trainer.proc.pid}")):
        return "staging", printed[-1]
    committed = [c.step for c in CommittedStore(checkpoints_uri).list()]
    newest = max(committed, default=-1)
    staged = {step: read_local_manifest(staging / step_name(step)) for step in staged_steps(staging) if step > newest}
    for name in storage.listdir(checkpoints_uri):
        step = parse_step(name)
        if step is None or step <= newest:
            continue
        files = set(storage.listdir(storage.join(checkpoints_uri, name)))
        if files and MANIFEST not in files:
            expected = set((staged.get(step) or {}).get("files", {}))
            return ("manifest" if expected and expected <= files else "upload"), printed[-1]
    return ("upload" if staged else "step"), printed[-1]


def test_ddp_sigkill_while_the_newest_checkpoint_is_only_staged(tmp_path, s3_root, s3_server):
    """2 processes on an S3 root behind a proxy that is cut after the first step: the session's
    checkpoints stay staged on local disk. Once its last one (step STEPS/2) is staged, SIGKILL the
    whole torchrun group. Proxy back, the next session resumes from that staged checkpoint and ends
    with the weights of an uninterrupted 2-process run."""
    half = STEPS // 2
    common = ("train.eval_every=100", "train.schedule=constant", "train.log_every=1", DROPOUT)
    run_uri = storage.join(s3_root, "runs", "killed")
    staged = staging_dir(tmp_path / "cache", run_uri)
    with TcpProxy(s3_server.port) as proxy:
        env = env_for(tmp_path / "cache", s3_env_through(proxy, s3_server.env()) | FAST_FAIL)
        res = voxrelay("prepare", CONFIG, *tiny(s3_root), env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        straight = tiny(s3_root, "name=straight", f"train.max_steps={STEPS}", *common)
        res = torchrun(2, "train", CONFIG, *straight, env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        trainer = Trainer(s3_root, env, "name=killed", f"train.max_steps={half}", *common, nproc=2)
        try:
            assert trainer.first_step.wait(300), trainer.output()
            proxy.cut()
            # the last save of a session is staged before its final wait for the upload
            deadline = time.monotonic() + 300
            while half not in staged_steps(staged) and trainer.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            trainer.kill()
        # the test process talks to the server directly, not through the proxy
        committed = [c.step for c in CommittedStore(storage.join(run_uri, "checkpoints")).list()]
        assert staged_steps(staged)[-1:] == [half] and max(committed, default=-1) < half, (committed, trainer.output())
        proxy.restore()
        res = torchrun(2, "train", CONFIG, *tiny(s3_root, "name=killed", f"train.max_steps={STEPS}", *common), env=env)
        assert res.returncode == 0, res.stdout + res.stderr
    assert f"resuming {run_uri} from step {half}" in res.stderr, res.stderr
    step_a, a = final_weights(storage.join(s3_root, "runs", "straight"), tmp_path / "fetch")
    step_b, b = final_weights(run_uri, tmp_path / "fetch")
    assert step_a == step_b == STEPS
    assert_same_weights(a, b)
