"""Packed batches (train.packing): a batch's examples in one row give the loss terms, counts and gradients of the
same examples padded, for every family that packs (codec_lm plain, with text positions scaled, grouped; orpheus
with the loss on all ids and on speech; both loss kernels); the packed plan; the setting's resolution."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.helpers.orpheus import save_llama3_tokenizer, save_tiny_llama
from voxrelay.data.loader import BatchPlan
from voxrelay.data.shards import EncodedUtterance
from voxrelay.errors import UserError
from voxrelay.models import packing
from voxrelay.models.base import DataSpec, pop_counts
from voxrelay.models.codec_lm.config import CodecLMConfig
from voxrelay.models.linear_ce import CHUNKED, MATERIALISED, causal_lm_hidden
from voxrelay.models.orpheus.config import OrpheusConfig
from voxrelay.models.registry import build_model

ORPHEUS_DATA = DataSpec(7, 4096, ["tara", "leo"], 11.71875, 24000)


def _terms_and_grads(model, batch: dict, kernel: str) -> tuple[dict, dict]:
    model.loss_kernel, model.loss_chunk_tokens = kernel, 7
    model.module.zero_grad(set_to_none=True)
    terms = model.loss(model.module, batch)
    sum(t.weight * t.sum / t.count.clamp_min(1) for t in terms.values()).backward()
    grads = {n: p.grad.clone() for n, p in model.module.named_parameters() if p.grad is not None}
    return {k: (float(t.sum.detach()), int(t.count)) for k, t in terms.items()}, grads


def _sharpen(model) -> None:
    """Peaked attention (queries and keys x 8): a token that attends across examples moves the loss well past the
    tolerance of the comparisons (see test_without_the_packed_attention_examples_would_see_each_other)."""
    with torch.no_grad():
        for name, p in model.module.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)


def _padded_and_packed(model, examples: list) -> tuple[dict, dict, dict, dict]:
    padded, packed = model.collate(examples), model.collate_packed(examples)
    counts = pop_counts(padded), pop_counts(packed)
    assert packed["input_ids"].shape[0] == 1 and packing.padded_fraction(packed) == 0.0
    assert packing.padded_fraction(padded) > 0.1  # the examples' lengths differ: padding to remove
    return padded, packed, *counts


def _hidden_gap(model, padded: dict, packed: dict) -> float:
    """Largest difference of the final hidden states of every real token, padded vs packed, over their scale."""
    with torch.no_grad():
        want = causal_lm_hidden(model.module, **packing.model_inputs(padded))[padded["attention_mask"].bool()]
        got = causal_lm_hidden(model.module, **packing.model_inputs(packed))[0]
    return float((got - want).abs().max() / want.abs().max())


def _assert_equal_losses(model, examples: list, kernels=(MATERIALISED,)) -> None:
    _sharpen(model)
    padded, packed, padded_counts, packed_counts = _padded_and_packed(model, examples)
    assert packed_counts == padded_counts
    model.enable_packing("cpu")
    assert _hidden_gap(model, padded, packed) <= 1e-5
    for kernel in kernels:
        (want, want_g), (got, got_g) = (_terms_and_grads(model, b, kernel) for b in (padded, packed))
        assert {k: c for k, (_, c) in got.items()} == {k: c for k, (_, c) in want.items()}
        for name in want:
            assert got[name][0] == pytest.approx(want[name][0], rel=1e-5, abs=1e-6), (kernel, name)
        assert got_g.keys() == want_g.keys() and want_g
        for name, g in want_g.items():
            err = float((got_g[name] - g).abs().max() / g.abs().max().clamp_min(1e-12))
            assert err <= 1e-5, (kernel, name, err)


def _codec_lm(**overrides):
    torch.manual_seed(0)
    cfg = CodecLMConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, dropout=0.0,
                        **{"frames_per_position": None} | overrides)
    return build_model(cfg, DataSpec(2, 64), 0)


def _codec_rows(n: int = 3) -> list:
    rng = np.random.default_rng(0)
    texts = ["a", "some longer words here", "mid text"]
    return [EncodedUtterance(f"r{i}", texts[i % 3], None, None, 1.0, rng.integers(0, 64, (2, 3 + 9 * i)))
            for i in range(n)]


@pytest.mark.parametrize("overrides", [{}, {"text_position_scale": 2.0},
                                       {"frames_per_position": 2, "text_position_scale": 0.875}],
                         ids=["plain", "text-positions", "grouped"])
def test_codec_lm_packed_equals_padded(overrides: dict) -> None:
    model = _codec_lm(**overrides)
    model.module.train()
    kernels = (MATERIALISED, CHUNKED) if model.chunked_heads else (MATERIALISED,)
    _assert_equal_losses(model, [model.example(r) for r in _codec_rows()], kernels)


@pytest.fixture(scope="module")
def orpheus_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("orpheus-packing")
    return save_tiny_llama(d / "orpheus", save_llama3_tokenizer(d / "tok"))


@pytest.mark.parametrize("loss_on", ["all", "speech"])
def test_orpheus_packed_equals_padded(orpheus_folder: Path, loss_on: str) -> None:
    torch.manual_seed(0)
    model = build_model(OrpheusConfig(init_from=str(orpheus_folder), max_seq_len=512, loss_on=loss_on),
                        ORPHEUS_DATA, 0)
    model.module.train()
    rng = np.random.default_rng(0)
    rows = [SimpleNamespace(text=t, speaker=s, description=None, codes=rng.integers(0, 4096, (7, n)))
            for t, s, n in (("hi", "tara", 2), ("a longer text here", "leo", 9), ("mid", None, 5))]
    _assert_equal_losses(model, [model.example(r) for r in rows], (MATERIALISED, CHUNKED))


def test_without_the_packed_attention_examples_would_see_each_other() -> None:
    """The equality above depends on the attention: plain SDPA over the packed row lets later examples attend to
    earlier ones, and the loss moves (so the tests above can fail)."""
    model = _codec_lm()
    model.module.eval()
    _sharpen(model)
    examples = [model.example(r) for r in _codec_rows()]
    padded, packed, *_ = _padded_and_packed(model, examples)
    assert _hidden_gap(model, padded, packed) > 100 * 1e-5  # 100 x the comparisons' tolerance
    model.enable_packing("cpu")
    assert _hidden_gap(model, padded, packed) <= 1e-5


def test_pack_lays_examples_end_to_end() -> None:
    examples = [{"input_ids": np.array([5, 6, 7]), "labels": np.array([5, 6, 7])},
                {"input_ids": np.array([8, 9]), "labels": np.array([-100, 9]), "position_ids": np.array([0, 4])}]
    batch = packing.pack(examples)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9]]  # nothing predicts an example's first id
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 4]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5] and int(batch["max_length_q"]) == 3


def _plan(packed: bool, window: int = 0) -> BatchPlan:
    rng = np.random.default_rng(1)
    lengths = rng.integers(10, 200, 500)
    return BatchPlan(lengths, lengths / 50.0, seed=3, batch_tokens=1000, shards=np.arange(500) // 50,
                     window=window, packed=packed)


@pytest.mark.parametrize("window", [0, 3])
def test_the_packed_plan_fills_the_budget_with_shuffled_rows(window: int) -> None:
    plan = _plan(True, window)
    batches = list(plan.batches(0))
    assert sorted(i for b in batches for i in b) == list(range(500))  # every row once
    sums = [int(plan.lengths[b].sum()) for b in batches]
    assert max(sums) <= 1000
    assert sum(sums) / (1000 * len(batches)) > 0.9  # rows cut where the next would pass the budget
    spread = [int(plan.lengths[b].max() - plan.lengths[b].min()) for b in batches]
    assert np.median(spread) > 100  # shuffled, not length-sorted: mixed lengths in a batch
    assert list(plan.batches(0)) == batches and list(plan.batches(1)) != batches  # a function of (seed, epoch)
    padded = _plan(False, window)
    padded_spread = [int(padded.lengths[b].max() - padded.lengths[b].min()) for b in padded.batches(0)]
    assert np.median(padded_spread) < 10


def _cfg(setting):
    return SimpleNamespace(train=SimpleNamespace(packing=setting), model=SimpleNamespace(family="parler"))


def test_packing_auto_is_on_where_the_family_packs_and_true_is_refused_where_it_cannot() -> None:
    from voxrelay.models.parler.model import Parler
    from voxrelay.models.vibevoice.model import VibeVoice
    from voxrelay.train.data import packing as decide

    packs = SimpleNamespace(packing_refusal=None)
    assert decide(packs, _cfg("auto")) and decide(packs, _cfg(True)) and not decide(packs, _cfg(False))
    for family in (Parler, VibeVoice):
        cannot = SimpleNamespace(packing_refusal=family.packing_refusal)
        assert not decide(cannot, _cfg("auto")) and not decide(cannot, _cfg(False))
        with pytest.raises(UserError, match=r"train.packing=true, but model.family=parler cannot pack.*auto"):
            decide(cannot, _cfg(True))


def test_a_run_saved_before_packing_resumes_unpacked() -> None:
    from voxrelay.config import config_changes, load_config
    from voxrelay.train.optim import started_schedule

    cfg = load_config(None, [])
    assert cfg.train.packing == "auto"
    saved = cfg.to_dict()
    del saved["train"]["packing"]
    kept = started_schedule(cfg.train, saved)
    assert kept.get("packing") is False
    cfg.train = cfg.train.model_copy(update=kept)
    assert config_changes(saved, cfg.to_dict()) == ([], [])


def test_flash_attention_only_where_it_is_safe() -> None:
    """Flash-attention's varlen kernel needs CUDA and bf16/fp16 compute; codec_lm with text positions never gets it
    (flash-attention's path for an unpacked prompt would take its restarting positions for packed examples)."""
    for device, flash_ok in (("cpu", True), ("cpu", False), ("cuda", False)):
        assert packing.kernel(device, flash_ok) == packing.PACKED_SDPA
    model = _codec_lm(text_position_scale=2.0)
    assert model.enable_packing("cpu", True) == packing.PACKED_SDPA
    assert model.module.config._attn_implementation == packing.PACKED_SDPA
