"""``train.precision: auto`` (issue 34 item 6): resolved from the card's capability (given, not read from torch),
recorded in the run's config, kept on resume; a run saved before ``auto`` keeps fp32."""

from __future__ import annotations

import pytest

from voxrelay.config import ConfigError, config_changes, load_config
from voxrelay.paths import CONFIG_SNAPSHOT
from voxrelay.precision import CPU, Capability, recorded, resolve, run_precision, settle

A100 = Capability("NVIDIA A100-SXM4-40GB", True)
T4 = Capability("Tesla T4", False)


def test_auto_is_the_default_of_a_new_config():
    assert load_config(None, []).train.precision == "auto"


@pytest.mark.parametrize(("card", "strategy", "expected"), [
    (A100, "ddp", "bf16"), (A100, "fsdp", "bf16"), (T4, "ddp", "fp16"), (CPU, "ddp", "no"), (CPU, "fsdp", "no"),
    (T4, "fsdp", "no"),  # FSDP has no fp16 loss scaler: fp32, not a refused fp16
])
def test_auto_resolves_by_what_the_card_does_natively(card, strategy, expected):
    assert resolve("auto", strategy, card)[0] == expected


def test_auto_under_fsdp_on_a_card_without_bf16_says_why_and_what_to_do():
    precision, why = resolve("auto", "fsdp", T4)
    assert precision == "no"
    assert "Tesla T4" in why and "no bf16" in why and "train.strategy=ddp" in why


def test_an_explicit_precision_is_kept_whatever_the_card():
    assert [resolve(p, "ddp", T4)[0] for p in ("no", "bf16", "fp16")] == ["no", "bf16", "fp16"]


def test_fsdp_with_fp16_is_still_refused_when_asked_for():
    with pytest.raises(ConfigError, match="train.precision=bf16 or no"):
        load_config(None, ["train.strategy=fsdp", "train.precision=fp16"])


def test_the_recorded_precision_of_a_saved_config():
    assert recorded({"train": {"precision": "bf16"}}) == "bf16"
    assert recorded({"train": {"precision": False}}) == "no"  # YAML's bare `no`
    assert recorded({"train": {"max_steps": 5}}) == "no"  # saved before the key could be auto: the old default
    assert recorded(None) is None and recorded({"train": {"precision": "auto"}}) is None


def test_a_resumed_run_keeps_its_recorded_precision_on_another_card():
    assert run_precision("auto", "ddp", T4, "bf16")[0] == "bf16"  # started on an A100, resumed on a T4
    assert "no native bf16" in run_precision("auto", "ddp", T4, "bf16")[1]
    assert run_precision("auto", "ddp", A100, "fp16")[0] == "fp16"  # started on a T4
    assert run_precision("auto", "ddp", A100, None)[0] == "bf16"  # nothing recorded: this card's


def _run(tmp_path, *more):
    return load_config(None, [f"root={tmp_path}", "name=r", *more])


def test_settle_records_the_resolved_precision_and_a_resume_finds_nothing_changed(tmp_path):
    first = settle(_run(tmp_path), fresh=False, card=A100)
    assert first.train.precision == "bf16" and "precision: bf16" in first.to_yaml()
    snapshot = tmp_path / "runs" / "r" / CONFIG_SNAPSHOT
    snapshot.parent.mkdir(parents=True)
    snapshot.write_text(first.to_yaml())
    again = settle(_run(tmp_path), fresh=False, card=T4)  # the next session lands on a T4
    assert again.train.precision == "bf16"
    assert config_changes(first.to_dict(), again.to_dict()) == ([], [])
    assert settle(_run(tmp_path), fresh=True, card=T4).train.precision == "fp16"  # --fresh: resolved anew


def test_a_run_saved_before_auto_keeps_fp32_on_a_bf16_card(tmp_path):
    old = _run(tmp_path, "train.precision=no").to_dict()
    snapshot = tmp_path / "runs" / "r" / CONFIG_SNAPSHOT
    snapshot.parent.mkdir(parents=True)
    snapshot.write_text(__import__("yaml").safe_dump(old))
    resumed = settle(_run(tmp_path), fresh=False, card=A100)
    assert resumed.train.precision == "no"
    assert config_changes(old, resumed.to_dict()) == ([], [])


def test_plan_prices_auto_on_a_card_without_bf16_as_training_resolves_it():
    """`plan --gpu t4` (or v100): DDP rows autocast in fp16 (the same bytes as bf16), FSDP rows in fp32 (more
    than on a bf16 card: gathered units and activations in fp32); the header says fp16 with a loss scaler."""
    from voxrelay.plan import Lengths, ModelFacts, compute_mode, gpu_bf16, make_plan
    from voxrelay.plan.formulas import Param, Shape

    cfg = load_config(None, [])
    assert [gpu_bf16(g) for g in ("t4", "v100", "colab-t4", "l4", None)] == [False, False, False, True, True]
    assert (compute_mode(cfg, "fsdp", False), compute_mode(cfg, "fsdp", True)) == ("fp32", "bf16")
    assert compute_mode(cfg, "ddp", False) == compute_mode(cfg, "ddp", True) == "autocast"
    params = [Param((1024, 1024), 4, True, True) for _ in range(8)]
    shape = Shape(1024, 2048, 8, 256, 128, 8, 1000)
    facts = ModelFacts({False: params, True: params}, {False: shape, True: shape},
                       {False: (2**20, 2**20), True: (2**20, 2**20)}, 1000)
    t4, a100 = (make_plan(cfg, facts, Lengths(512, "t"), 2, 15 * 10**9, bf16) for bf16 in (False, True))
    for a, b in zip(t4.rows, a100.rows, strict=True):
        more = a.per_gpu_bytes["total"] > b.per_gpu_bytes["total"]
        assert more if a.strategy.strategy == "fsdp" else a.per_gpu_bytes == b.per_gpu_bytes, a.strategy
    assert t4.precision.startswith("auto: fp16 with a loss scaler") and a100.precision == "auto: bf16"
