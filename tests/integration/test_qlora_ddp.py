"""QLoRA (``train.lora.base_bits=4``) under DDP with 2 gloo processes and gradient checkpointing: a run resumed from
its step-2 checkpoint (each process re-quantising the base it rebuilt) ends bit-equal to the straight run; dropout
on, so the RNG of each process must be restored too. One process: tests/unit/train/test_plan_combinations.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.runner import CONFIG, assert_same_weights, env_for, final_weights, torchrun
from tests.helpers.tiny import tiny

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # tiers: see tests/conftest.py

pytest.importorskip("bitsandbytes")

QLORA = ("train.eval_every=100", "model.dropout=0.1", "train.lora.r=4", "train.lora.dropout=0.1",
         "train.lora.base_bits=4", "train.gradient_checkpointing=true", "checkpoint.every_steps=2",
         "train.max_steps=3")


def test_two_process_qlora_resumes_bit_for_bit(tmp_path: Path, monkeypatch):
    from voxrelay.config import load_config
    from voxrelay.data.prepare import prepare

    env, root = env_for(tmp_path / "cache"), str(tmp_path / "root")
    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    prepare(load_config(CONFIG, tiny(root)))  # in this process: only the training runs as 2 processes
    res = torchrun(2, "train", CONFIG, *tiny(root, "name=straight", *QLORA), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "QLoRA: 7 frozen Linears" in " ".join(res.stderr.split())  # the layer's 7 projections, on each rank
    runs = tmp_path / "root" / "runs"
    shutil.copytree(runs / "straight", runs / "killed")  # as a kill right after the step-2 commit leaves it
    shutil.rmtree(runs / "killed" / "checkpoints" / "step-00000003")
    res = torchrun(2, "train", CONFIG, *tiny(root, "name=killed", *QLORA), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"resuming {runs / 'killed'} from step 2" in res.stderr, res.stderr
    step_a, a = final_weights(str(runs / "straight"), tmp_path / "fetch")
    step_b, b = final_weights(str(runs / "killed"), tmp_path / "fetch")
    assert step_a == step_b == 3
    assert a and all(".lora_" in k or ".modules_to_save." in k for k in a)  # the adapters, no quantised weight
    assert_same_weights(a, b)
