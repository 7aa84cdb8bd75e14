"""Every strategy combination `voxrelay plan` can recommend, run at tiny size: each trains (its weights move),
applies what it says (gradient checkpointing on, 8-bit states, FSDP units with or without CPU offload, only
adapters trainable), saves, and a run killed after its first save and resumed ends bit-equal to a straight run.
The combinations come from the plan's own list, so a row added to the plan without a run here fails.

FSDP runs here in a world of one process (the code paths of sharding, offload and the sharded checkpoint; the
2-process runs are in tests/integration/test_fsdp.py); dropout > 0 so that resuming must restore the RNG."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.helpers.prepared import corpus
from tests.helpers.runner import CONFIG, assert_same_weights, final_weights
from tests.helpers.tiny import tiny
from voxrelay.checkpoint.manager import CheckpointManager
from voxrelay.plan import Strategy, strategies

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py


def _flags(st: Strategy) -> tuple:
    return (st.strategy, st.lora, st.optimizer, st.gradient_checkpointing, st.cpu_offload, st.base_bits,
            st.activation_offload)


# every row for AdamW configs; for Lion's, the rows without LoRA or offload (the optimizer is orthogonal to those);
# QLoRA's int8 base too (the plan's rows have the 4-bit one; a config may ask for 8); activation offload's rows
# with AdamW only (it moves activations, not states)
COMBOS = sorted({_flags(s) for opt in ("adamw", "adamw_8bit") for s in strategies(2, opt)
                 if opt == "adamw" or not s.activation_offload}
                | {_flags(s) for s in strategies(2, "lion") if not s.lora and not s.cpu_offload
                   and not s.activation_offload}
                | {("ddp", True, "adamw", True, False, 8, False)})


def _name(combo: tuple) -> str:
    strategy, lora, optimizer, gc, offload, bits, act_offload = combo
    kind = f"qlora{bits}" if bits else "lora" if lora else "full"
    return "-".join([strategy, kind, optimizer] + ["gc"] * gc + ["offload"] * offload + ["act-offload"] * act_offload)


def _overrides(combo: tuple) -> list[str]:
    strategy, lora, optimizer, gc, offload, bits, act_offload = combo
    out = [f"train.strategy={strategy}", f"train.optimizer={optimizer}", f"train.gradient_checkpointing={gc}"]
    out += ["train.cpu_offload=true"] if offload else []
    out += [f"train.lora.base_bits={bits}"] if bits else []
    out += ["train.activation_offload=true"] if act_offload else []
    # the embeddings in full beside the adapters: tensors big enough for 8-bit states (bitsandbytes keeps fp32 ones
    # under 4,096 elements), and modules_to_save copies saved and resumed too
    return out + (["train.lora.r=4", "train.lora.dropout=0.1", "train.lora.embeddings=full"] if lora else [])


@pytest.fixture(scope="module")
def root(tmp_path_factory, shared_tmp) -> str:
    base = tmp_path_factory.mktemp("combos")
    shutil.copytree(corpus(shared_tmp) / "root", base / "root")  # the run's tiny corpus, prepared once
    return str(base / "root")


def _train(root: str, name: str, combo: tuple, steps: int = 3):
    from voxrelay.config import load_config
    from voxrelay.train.build import build_run
    from voxrelay.train.loop import train

    cfg = load_config(CONFIG, tiny(root, f"name={name}", f"train.max_steps={steps}", "train.eval_every=1000",
                                   "train.eval_synth=0", "checkpoint.every_steps=2", "model.dropout=0.1",
                                   "train.warmup_steps=0", "train.lr=1e-2", *_overrides(combo)))
    run = build_run(cfg)
    result = train(run)
    assert result.exit_code == 0 and result.step == steps
    return run


def _applied(run, combo: tuple) -> None:
    """What the combination says is what the run built."""
    from voxrelay.train.offload import offloads

    strategy, lora, optimizer, gc, offload, bits, act_offload = combo
    module = run.model.module
    assert offloads(module) == act_offload
    units = [m for m in module.modules() if hasattr(m, "_get_fsdp_state")]
    assert bool(units) == (strategy == "fsdp")
    groups = [u._get_fsdp_state()._fsdp_param_group for u in units]
    from torch.distributed.fsdp import CPUOffloadPolicy

    assert {isinstance(g.offload_policy, CPUOffloadPolicy) for g in groups if g is not None} <= {offload}
    inner = getattr(module, "base_model", module)
    assert any(getattr(m, "gradient_checkpointing", False) for m in inner.modules()) == gc
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or "modules_to_save" in n for n in trainable) == lora
    optimizer_ = getattr(run.optimizer, "optimizer", run.optimizer)  # accelerate's wrapper
    states = [v for s in optimizer_.state.values() for v in s.values() if torch.is_tensor(v)]
    assert (torch.uint8 in {t.dtype for t in states}) == optimizer.endswith("_8bit")
    assert ("exp_avg_sq" in {k for s in optimizer_.state.values() for k in s}) == (optimizer == "adamw")
    quantised = {type(m).__name__ for m in module.modules()} & {"Linear4bit", "Linear8bitLt"}
    assert quantised == ({"Linear4bit"} if bits == 4 else {"Linear8bitLt"} if bits == 8 else set())


@pytest.mark.parametrize("combo", COMBOS, ids=[_name(c) for c in COMBOS])
def test_every_combination_plan_recommends_trains_and_resumes_exactly(root, combo, tmp_path, monkeypatch):
    """A straight run to step 3 saves at step 2; that run folder as a kill right after the step-2 commit leaves
    it (the step-3 checkpoint gone) is resumed to step 3: it must end bit-equal to the straight run."""
    import torch.distributed as dist

    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))
    name = _name(combo)
    straight, killed = Path(root) / "runs" / f"straight-{name}", Path(root) / "runs" / f"killed-{name}"
    own = not dist.is_initialized()  # FSDP makes a world of one; gone again after the test
    try:
        _applied(_train(root, straight.name, combo), combo)
        shutil.copytree(straight, killed)
        shutil.rmtree(killed / "checkpoints" / "step-00000003")
        assert _train(root, killed.name, combo).resumed_from == 2
    finally:
        if own and dist.is_initialized():
            dist.destroy_process_group()
    step, a = final_weights(str(straight), tmp_path / "fetch")
    _, b = final_weights(str(killed), tmp_path / "fetch")
    assert step == 3
    assert_same_weights(a, b)
    _, at_2, _ = CheckpointManager(str(straight), staging_dir=tmp_path / "fetch").load_model(step=2)
    assert at_2.keys() == a.keys() and all(not torch.equal(at_2[k], a[k]) for k in a)  # every saved tensor trained
