"""The cost estimate's arithmetic, each item against numbers worked out by hand (GiB = 2^30 bytes, a month =
730 hours), and when its advice is shown."""

from __future__ import annotations

import pytest

from voxrelay.config import ConfigError, load_config
from voxrelay.cost.config import CostConfig
from voxrelay.cost.estimate import GIB, RunFacts, Usage, cost_report, format_cost, training_spend


def facts(**kw) -> RunFacts:
    base = dict(step=50, max_steps=100, finished=False, steps_per_sec=None, kept=2, kept_bytes=0,
                checkpoint_bytes=0, age_s=0.0, keep_last=2, every_steps=100)
    return RunFacts(**(base | kw))


def test_gpu_hours_so_far_and_to_finish():
    cost = CostConfig(gpu_hour=1.5)
    u = Usage(process_seconds=7200.0, processes=2)  # 1 h of wall time on 2 GPUs
    r = cost_report(u, cost, facts())
    assert r.line("gpu").so_far == pytest.approx(3.0)  # 2 GPU-h x $1.5
    assert r.line("gpu").to_finish == pytest.approx(3.0)  # 50 steps left at the average of 50 done: 2 GPU-h more
    # measured: 0.01 steps/s -> 50 steps in 5000 s on 2 processes = 2.7778 GPU-h x 1.5 = 4.1667
    r = cost_report(u, cost, facts(steps_per_sec=0.01))
    assert r.line("gpu").to_finish == pytest.approx(50 / 0.01 * 2 / 3600 * 1.5)
    assert "2 GPU-h (2 processes) x $1.5/h; 2.78 h to finish" in r.line("gpu").how
    finished = cost_report(u, cost, facts(step=100, finished=True))
    assert finished.line("gpu").to_finish == 0
    unpriced = cost_report(u, CostConfig(), facts())
    assert unpriced.line("gpu").so_far is None and "not priced: set cost.gpu_hour" in unpriced.line("gpu").how
    assert unpriced.notes and unpriced.advice == []


def test_operations_class_a_and_b():
    cost = CostConfig(gpu_hour=0)
    r = cost_report(Usage(class_a=20_000, class_b=50_000), cost, facts(step=25))
    # 2 x $0.05 + 5 x $0.004 = 0.10 + 0.02; 75 steps left for 25 done: three times as much again
    assert r.line("operations").so_far == pytest.approx(0.12)
    assert r.line("operations").to_finish == pytest.approx(0.36)
    assert r.spent == pytest.approx(0.12)


def test_egress_only_across_regions_and_replication_only_multi_region():
    u = Usage(bytes_read=3 * GIB, bytes_written=1 * GIB)
    same = cost_report(u, CostConfig(gpu_hour=0), facts(step=100, finished=True, kept_bytes=GIB))
    assert same.line("egress").so_far == 0 and same.line("replication").so_far == 0
    assert "cost.cross_region is false" in same.line("egress").how
    apart = CostConfig(gpu_hour=0, cross_region=True, multi_region=True)
    r = cost_report(u, apart, facts(step=100, finished=True, kept_bytes=GIB))
    assert r.line("egress").so_far == pytest.approx(4 * 0.02)  # 3 GiB read + 1 written x $0.02
    assert r.line("replication").so_far == pytest.approx(1 * 0.02)  # 1 GiB written x $0.02
    assert training_spend(u, apart) == pytest.approx({"gpu": 0, "operations": 0, "egress": 0.08, "replication": 0.02})


def test_checkpoints_stored_and_soft_deleted():
    cost = CostConfig(gpu_hour=0)
    u = Usage(bytes_written=10 * GIB)
    done = facts(step=100, finished=True, kept=2, kept_bytes=2 * GIB, checkpoint_bytes=GIB, age_s=730 * 3600)
    r = cost_report(u, cost, done)
    # 8 GiB written and no longer kept x $0.02/GiB-month x 7 days of a 30.417-day month
    assert r.line("soft delete").so_far == pytest.approx(8 * 0.02 * 7 / (730 / 24))
    assert r.line("soft delete").to_finish == 0
    assert r.line("stored").so_far == pytest.approx(2 * 0.02 * 1)  # 2 GiB for a month
    assert r.line("stored").to_finish == pytest.approx(2 * 0.02 * 1)  # kept cost.keep_months=1 after
    # half way: twice the bytes written by the end, 3 checkpoints of 1 GiB kept (keep_last 2 + the best)
    half = facts(step=50, kept=2, kept_bytes=2 * GIB, checkpoint_bytes=GIB, keep_best=True)
    r = cost_report(u, CostConfig(gpu_hour=0, keep_months=2), half)
    assert r.line("soft delete").to_finish == pytest.approx((20 - 3 - 8) * 0.02 * 7 / (730 / 24))
    assert r.line("stored").to_finish == pytest.approx(3 * 0.02 * 2)  # no hours left known: keep_months only
    assert r.line("soft delete").to_finish is not None


def test_advice_when_checkpoints_dominate_names_the_settings():
    u = Usage(process_seconds=3600.0, bytes_written=100 * GIB, class_a=1000)
    settings = dict(step=100, finished=True, kept=5, kept_bytes=5 * GIB, checkpoint_bytes=GIB, keep_last=5,
                    every_steps=100)
    cheap_gpu = CostConfig(gpu_hour=0.1, multi_region=True)  # $0.10 of GPU against $2.00 of replication
    r = cost_report(u, cheap_gpu, facts(**settings))
    text = "\n".join(r.advice)
    assert r.advice[0].startswith("checkpoints cost $"), r.advice
    assert "raise checkpoint.every_steps from 100 to 400" in text
    assert "lower checkpoint.keep_last from 5 to 2" in text
    assert "a regional bucket in the GPU's region" in text
    assert "--clear-soft-delete" in text  # 95 GiB soft-deleted for 7 days: $0.44 of ~$2.7
    assert any(line.startswith("advice       checkpoints cost") for line in format_cost(r))
    # the same run where the GPU is most of the bill: no advice
    assert cost_report(u, CostConfig(gpu_hour=100.0, multi_region=True), facts(**settings)).advice == []
    # the GPU not priced: nothing to compare with, a note instead
    unpriced = cost_report(u, CostConfig(multi_region=True), facts(**settings))
    assert unpriced.advice == [] and "cost.gpu_hour" in unpriced.notes[0]


def test_budget_needs_a_gpu_price_and_is_a_resume_safe_key():
    with pytest.raises(ConfigError, match="cost.budget=5.0 needs cost.gpu_hour"):
        load_config(None, ["cost.budget=5"])
    from voxrelay.config import config_changes

    old = load_config(None, ["cost.gpu_hour=1", "cost.budget=5"]).to_dict()
    new = load_config(None, ["cost.gpu_hour=2", "cost.budget=50"]).to_dict()
    assert config_changes(old, new) == (["cost.budget", "cost.gpu_hour"], [])
