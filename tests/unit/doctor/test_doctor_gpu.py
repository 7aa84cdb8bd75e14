"""The GPU row through the real memory plan (the demo model built on the meta device): a card that holds the
config's strategy passes, one that does not fails with the plan's next-best strategy as the fix. The card is
given (this runs on CPU machines); the plan is voxrelay's own, as `voxrelay plan` and `train` compute it."""

from __future__ import annotations

from voxrelay.cli import demo_config_path
from voxrelay.config import load_config
from voxrelay.doctor import FAIL, OK, SKIP
from voxrelay.doctor.diagnose import gpu_part
from voxrelay.doctor.facts import Gpu
from voxrelay.plan import make_plan
from voxrelay.plan.model import lengths, model_facts

GB = 10**9


def test_gpu_row_follows_the_plan(tmp_path):
    cfg = load_config(demo_config_path(), [f"root={tmp_path}"])  # no prepared data: train.batch_tokens is used
    big, checkpoint = gpu_part(cfg, Gpu("NVIDIA A100-SXM4-40GB", int(42.4 * GB), 1))
    assert big.verdict == OK and "ddpx1 full adamw" in big.found
    facts, model = model_facts(cfg, None)  # the same plan, asked of the plan module itself
    plan = make_plan(cfg, facts, lengths(cfg, model, None, cfg.train.batch_tokens), 1, int(42.4 * GB))
    total = next(r for r in plan.rows if r.strategy.name == "ddpx1 full adamw").per_gpu_bytes["total"]
    assert f"{total / GB:.1f} GB per GPU" in big.found
    assert 0 < checkpoint < total  # trainable weights + optimizer states: part of what the GPU holds

    small, _ = gpu_part(cfg, Gpu("small", total - 1, 1))
    assert small.verdict == FAIL and small.fix.startswith("try train.")

    cfg = load_config(demo_config_path(), [f"root={tmp_path}", "train.batch_tokens=null", "train.batch_seconds=30"])
    unknown, checkpoint = gpu_part(cfg, Gpu("small", GB, 1))
    assert unknown.verdict == SKIP and "voxrelay prepare" in unknown.found and checkpoint is None
