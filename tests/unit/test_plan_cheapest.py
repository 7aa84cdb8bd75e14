"""``voxrelay plan --cheapest`` against prices worked by hand from the card table (issue 34 item 7)."""

from __future__ import annotations

import pytest

from voxrelay.config import load_config
from voxrelay.plan import Lengths, ModelFacts
from voxrelay.plan.cards import CARDS, PROFILES, card_named
from voxrelay.plan.cheapest import MFU, offers
from voxrelay.plan.formulas import GB, Param, Shape

SIDE, LAYERS, HIDDEN, TOKENS, STEPS = 8192, 4, 1024, 512, 1000


def _facts(matrices: int) -> ModelFacts:
    """``matrices`` trainable fp32 Linear weights of SIDE x SIDE (LoRA prices the same: no cheaper LoRA row)."""
    params = [Param((SIDE, SIDE), 4, True, True) for _ in range(matrices)]
    shape = Shape(HIDDEN, 2 * HIDDEN, 8, 256, 128, LAYERS, 1000)
    unit = (SIDE * SIDE, SIDE * SIDE)
    return ModelFacts({False: params, True: params}, {False: shape, True: shape}, {False: unit, True: unit}, 1000)


def _by_hand(matrices: int, tflops: float, usd_hour: float) -> float:
    """USD of STEPS steps of a full fine-tune (no checkpointing) on one GPU: 6N FLOPs per token + 6 L h s."""
    flops_per_token = 6 * matrices * SIDE * SIDE + 6 * LAYERS * HIDDEN * TOKENS
    seconds = flops_per_token * TOKENS / (tflops * 1e12 * MFU)
    return STEPS * seconds / 3600 * usd_hour


def _cfg(*more: str):
    return load_config(None, ["train.optimizer=adafactor", f"train.max_steps={STEPS}", *more])


def test_a_small_model_is_cheapest_on_an_rtx_4090_on_demand_and_spot():
    """0.60 / 165 TFLOPS on demand is the table's lowest price per FLOP (L40S: 1.40 / 362); spot 0.34 / 165."""
    best = offers(_cfg(), _facts(4), Lengths(TOKENS, "t"), 1, host_memory=16 * GB)[0]
    assert (best.card.key, best.row.strategy.name) == ("rtx4090", "ddpx1 full adafactor")
    assert best.cost == pytest.approx(_by_hand(4, 165, 0.60), rel=1e-9)
    spot = offers(_cfg(), _facts(4), Lengths(TOKENS, "t"), 1, spot=True, host_memory=16 * GB)[0]
    assert spot.card.key == "rtx4090" and spot.cost == pytest.approx(_by_hand(4, 165, 0.34), rel=1e-9)


def test_a_model_over_24_gb_goes_to_the_l40s():
    """44 matrices of 8192^2 (2.95B parameters, ~27 GB with Adafactor): no 16-24 GB card fits (the offload row
    needs more host RAM than the 16 GB given), the L40S is the cheapest that does: 1.40 USD/h at 362 TFLOPS."""
    found = offers(_cfg(), _facts(44), Lengths(TOKENS, "t"), 1, host_memory=16 * GB)
    assert not {o.card.key for o in found} & {"t4", "v100", "l4", "a10g", "rtx3090", "rtx4090"}
    best = found[0]
    assert best.card.key == "l40s" and best.row.per_gpu_bytes["total"] > CARDS["rtx4090"].memory
    assert best.cost == pytest.approx(_by_hand(44, 362, 1.40), rel=1e-9)
    assert best.basis.startswith("estimated from FLOPs at 30% of 362 TFLOPS")


def test_cost_gpu_hour_overrides_every_price_so_the_fastest_card_wins():
    found = offers(_cfg("cost.gpu_hour=1.0"), _facts(4), Lengths(TOKENS, "t"), 1, host_memory=16 * GB)
    assert found[0].card.key == "h100"  # 989 TFLOPS (the H200 ties, with more memory than needed)
    assert found[0].cost == pytest.approx(_by_hand(4, 989, 1.0), rel=1e-9)


def test_a_measured_step_time_is_priced_beside_the_estimate_that_ranks_the_cards():
    best = offers(_cfg(), _facts(4), Lengths(TOKENS, "t"), 1, host_memory=16 * GB, measured=2.0)[0]
    assert best.card.key == "rtx4090" and best.cost == pytest.approx(_by_hand(4, 165, 0.60), rel=1e-9)
    assert best.measured_cost == pytest.approx(STEPS * 2.0 / 3600 * 0.60, rel=1e-9)


def test_the_card_table_names_the_cheap_cards_and_which_have_no_bf16():
    assert {k: c.memory // 2**30 for k, c in CARDS.items()} == {
        "t4": 14, "v100": 15, "l4": 22, "a10g": 22, "rtx3090": 23, "rtx4090": 23, "a100-40gb": 39, "l40s": 44,
        "a100-80gb": 79, "h100": 79, "h200": 139}  # what torch can use of 16, 16, 24, ..., 141 GB
    assert sorted(k for k, c in CARDS.items() if not c.bf16) == ["t4", "v100"]
    assert all(c.on_demand and c.spot and c.spot < c.on_demand for c in CARDS.values())
    card, profile = card_named("colab-t4")
    assert card.key == "t4" and profile is PROFILES["colab-t4"] and profile.host_memory == int(12.7 * GB)


def test_the_answer_names_card_price_step_time_and_its_basis():
    import io

    from rich.console import Console

    from voxrelay.plan.cheapest import print_offers

    found = offers(_cfg(), _facts(44), Lengths(TOKENS, "t"), 1, host_memory=16 * GB, measured=3.0)
    buf = io.StringIO()
    print_offers(found, Console(file=buf, width=200, color_system=None), False, 16 * GB)
    last = buf.getvalue().strip().splitlines()
    assert last[-2].startswith("cheapest: 1 x L40S 48GB (on-demand $1.4/GPU-h, RunPod), ddpx1 full adafactor: ")
    assert f"${_by_hand(44, 362, 1.40):.2f}" in last[-2] and "estimated from FLOPs at 30% of 362 TFLOPS" in last[-2]
    assert last[-1].startswith("at this run's measured 3 s per step") and f"${STEPS * 3 / 3600 * 1.4:.2f}" in last[-1]


def test_a_price_of_ones_own_is_named_as_such_and_equal_prices_go_to_the_fastest_card():
    import io

    from rich.console import Console

    from voxrelay.plan.cheapest import print_offers

    found = offers(_cfg("cost.gpu_hour=0"), _facts(4), Lengths(TOKENS, "t"), 1, spot=True, host_memory=16 * GB)
    assert found[0].card.key in ("h100", "h200") and all(o.cost == 0 for o in found)  # 989 TFLOPS: the fewest hours
    assert [o.hours for o in found] == sorted(o.hours for o in found)
    buf = io.StringIO()
    print_offers(found, Console(file=buf, width=200, color_system=None), True, 16 * GB)
    out = buf.getvalue()
    assert "cost.gpu_hour prices" in out and "(cost.gpu_hour $0/GPU-h, cost.gpu_hour)" in out, out
    assert "RunPod" not in out and "Google Cloud" not in out


def test_no_card_for_want_of_host_ram_says_how_much_it_needs():
    import io

    from rich.console import Console

    from voxrelay.plan.cheapest import host_shortfall, print_offers

    cfg, facts, ln = _cfg(), _facts(4), Lengths(TOKENS, "t")
    assert offers(cfg, facts, ln, 1, host_memory=1 * GB) == []
    need = host_shortfall(cfg, facts, ln, 1)
    assert need == offers(cfg, facts, ln, 1, host_memory=64 * GB)[0].row.host_bytes["machine"] > 1 * GB
    buf = io.StringIO()
    print_offers([], Console(file=buf, width=250, color_system=None), False, 1 * GB, need)
    assert f"needs at least {need / 1e9:.1f} GB of host RAM per machine" in buf.getvalue()


def test_cheapest_ignores_gpu_and_spot_needs_cheapest(tmp_path):
    from typer.testing import CliRunner

    from voxrelay.cli import app, demo_config_path

    base = ["plan", str(demo_config_path()), f"root={tmp_path}", "--seq-len", "256"]
    from voxrelay.plan import PlanError

    res = CliRunner().invoke(app, [*base, "--spot"])  # a UserError: `voxrelay` exits 2 with its one line
    assert isinstance(res.exception, PlanError) and "add --cheapest" in str(res.exception), res.output
    res = CliRunner().invoke(app, [*base, "--cheapest", "--gpu", "colab-t4"])
    assert res.exit_code == 0, res.output
    assert "--gpu colab-t4 is ignored with --cheapest" in res.output and "cheapest: 1 x" in res.output
    assert "host RAM not checked" in res.output  # not the Colab runtime's 12.7 GB for every card
