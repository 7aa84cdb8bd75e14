"""Each family whose loss goes through the chunked head loss (train.chunked_loss) gives the loss terms and counts
of its materialised loss, and the same gradients, within float tolerance: orpheus (with LoRA: the tied head
trained in full through peft), codec_lm, vibevoice. A resumed run saved before the key keeps the logits."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.helpers.orpheus import save_llama3_tokenizer, save_tiny_llama
from voxrelay.models.base import DataSpec, pop_counts
from voxrelay.models.linear_ce import CHUNKED, MATERIALISED
from voxrelay.models.orpheus.config import OrpheusConfig
from voxrelay.models.registry import build_model

ORPHEUS_DATA = DataSpec(7, 4096, ["tara", "leo"], 11.71875, 24000)


def _terms_and_grads(model, batch: dict, kernel: str, chunk: int = 5) -> tuple[dict, dict]:
    model.loss_kernel, model.loss_chunk_tokens = kernel, chunk
    model.module.zero_grad(set_to_none=True)
    terms = model.loss(model.module, batch)
    scaled = sum(t.weight * t.sum / t.count.clamp_min(1) for t in terms.values())
    scaled.backward()
    grads = {n: p.grad.clone() for n, p in model.module.named_parameters() if p.grad is not None}
    return {k: (float(t.sum), int(t.count)) for k, t in terms.items()}, grads


def _assert_same(model, batch: dict) -> None:
    (want, want_g), (got, got_g) = (_terms_and_grads(model, batch, k) for k in (MATERIALISED, CHUNKED))
    assert want.keys() == got.keys()
    for name in want:
        assert got[name][1] == want[name][1]  # counts unchanged
        assert got[name][0] == pytest.approx(want[name][0], rel=1e-5, abs=1e-6), name
    assert got_g.keys() == want_g.keys() and want_g
    for name, g in want_g.items():
        err = float((got_g[name] - g).abs().max() / g.abs().max().clamp_min(1e-12))
        assert err <= 1e-5, (name, err)


@pytest.fixture(scope="module")
def orpheus_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("orpheus-head")
    return save_tiny_llama(d / "orpheus", save_llama3_tokenizer(d / "tok"))


def _orpheus_batch(model) -> dict:
    rng = np.random.default_rng(0)
    rows = [SimpleNamespace(text=t, speaker=s, description=None, codes=rng.integers(0, 4096, (7, n)))
            for t, s, n in (("hi", "tara", 3), ("a longer text here", "leo", 7))]
    batch = model.collate([model.example(r) for r in rows])
    pop_counts(batch)
    return batch


@pytest.mark.parametrize("lora", [False, True])
def test_orpheus_chunked_loss_equals_the_materialised_one(orpheus_folder: Path, lora: bool) -> None:
    from voxrelay.models.lora import apply_lora
    from voxrelay.models.lora_config import LoraConfig

    torch.manual_seed(0)
    model = build_model(OrpheusConfig(init_from=str(orpheus_folder), max_seq_len=512), ORPHEUS_DATA, 0)
    if lora:  # the family's defaults: lm_head and embed_tokens trained in full (peft's copies), still tied
        apply_lora(model, LoraConfig())
    model.module.train()
    _assert_same(model, _orpheus_batch(model))


@pytest.mark.parametrize("scale", [None, 2.0])  # 2.0: text positions scaled (position_ids passed through)
def test_codec_lm_chunked_loss_equals_the_materialised_one(scale: float | None) -> None:
    from voxrelay.data.shards import EncodedUtterance
    from voxrelay.models.codec_lm.config import CodecLMConfig

    torch.manual_seed(0)
    cfg = CodecLMConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, dropout=0.0,
                        frames_per_position=None, text_position_scale=scale)
    model = build_model(cfg, DataSpec(4, 64), 0)
    assert model.chunked_heads
    rng = np.random.default_rng(0)
    rows = [EncodedUtterance(f"r{i}", "some words", None, None, 1.0, rng.integers(0, 64, (4, 5 + 3 * i)))
            for i in range(2)]
    batch = model.collate([model.example(r) for r in rows])
    pop_counts(batch)
    _assert_same(model, batch)


def test_vibevoice_chunked_ce_equals_the_materialised_one(tmp_path: Path) -> None:
    from tests.helpers.vibevoice import save_tiny_vibevoice
    from tests.unit.models.test_vibevoice_training import ROWS
    from voxrelay.models.vibevoice.config import VibeVoiceFamilyConfig

    cfg = VibeVoiceFamilyConfig(init_from=str(save_tiny_vibevoice(tmp_path / "vv")), max_length=1024,
                                voice_prompt_drop_rate=0.0)
    model = build_model(cfg, DataSpec(1, 65536, [], 24000.0, 24000), seed=0)
    model.use_corpus(ROWS)
    batch = model.collate([model.example(r) for r in ROWS[:2]])
    pop_counts(batch)
    model.module.eval()  # no dropout; the diffusion noise is drawn again from the same generator state
    state = model.module.generator.get_state()
    results = []
    for kernel in (MATERIALISED, CHUNKED):
        model.module.generator.set_state(state)
        results.append(_terms_and_grads(model, batch, kernel))
    (want, want_g), (got, got_g) = results
    assert got["ce"][1] == want["ce"][1] and got["ce"][0] == pytest.approx(want["ce"][0], rel=1e-5)
    assert got["diffusion"] == want["diffusion"]
    head = [n for n in want_g if "lm_head" in n or "embed_tokens" in n]
    assert head
    for name in head:
        assert float((got_g[name] - want_g[name]).abs().max() / want_g[name].abs().max()) <= 1e-5


def test_a_run_saved_before_chunked_loss_resumes_with_the_logits_materialised() -> None:
    """A checkpoint's config without train.chunked_loss stands for false (what it trained with): a resumed
    session that does not set the key keeps it; a new run gets the chunked loss."""
    from voxrelay.config import config_changes, load_config
    from voxrelay.train.optim import started_schedule

    cfg = load_config(None, [])
    assert cfg.train.chunked_loss
    saved = cfg.to_dict()
    del saved["train"]["chunked_loss"], saved["train"]["loss_chunk_tokens"]
    kept = started_schedule(cfg.train, saved)
    assert kept == {"chunked_loss": False}
    cfg.train = cfg.train.model_copy(update=kept)
    assert config_changes(saved, cfg.to_dict()) == ([], [])  # the resume check finds nothing changed


def test_the_run_says_which_loss_it_uses(orpheus_folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    from voxrelay.config import load_config
    from voxrelay.train.strategies import choose_loss

    model = build_model(OrpheusConfig(init_from=str(orpheus_folder), max_seq_len=512), ORPHEUS_DATA, 0, meta=True)
    cases = [([], CHUNKED, "chunked linear cross-entropy, 256 tokens per chunk"),
             (["train.loss_chunk_tokens=64"], CHUNKED, "64 tokens per chunk"),
             (["train.chunked_loss=false"], MATERIALISED, "loss: materialised logits"),
             (["train.strategy=fsdp"], MATERIALISED, "materialised logits (train.strategy=fsdp)")]
    for overrides, kernel, words in cases:
        caplog.clear()
        with caplog.at_level("INFO", logger="voxrelay.models.linear_ce"):
            choose_loss(model, load_config(None, ["model.family=orpheus", *overrides]).train, "cpu")
        assert model.loss_kernel == kernel and words in caplog.text, (overrides, caplog.text)
    # a model whose loss has no single head to chunk says so too (the demo's grouped codec_lm)
    grouped = build_model(load_config(None, ["model.frames_per_position=2"]).model, DataSpec(4, 256), 0, meta=True)
    assert not grouped.chunked_heads
    caplog.clear()
    with caplog.at_level("INFO", logger="voxrelay.models.linear_ce"):
        choose_loss(grouped, load_config(None, []).train, "cpu")
    assert "loss: this codec_lm model's own, logits materialised" in caplog.text, caplog.text
