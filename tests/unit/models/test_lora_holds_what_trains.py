"""LoRA holds only what trains (issue 34 item 2): under ``model.weights_dtype: auto`` (the default) the frozen base
is in the compute dtype and what trains in float32; no embedding or head trains in full unless tokens were added,
and then only their rows (peft's trainable_token_indices, tied head included), in an export peft loads; a run
saved before these defaults resumes as it trained."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.orpheus import save_llama3_tokenizer, save_tiny_llama
from voxrelay.config import load_config
from voxrelay.models.base import DataSpec
from voxrelay.models.orpheus import layout as L

DATA = DataSpec(7, 4096, ["tara"], 11.71875, 24000)
TINY = ["model.hidden_size=32", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=64",
        "model.num_layers=2"]


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("lora-dtype")
    tok = save_llama3_tokenizer(base / "tokenizer")
    return tok, save_tiny_llama(base / "llama3", tok, orpheus=False)


def _lora_model(overrides: list[str]):
    from voxrelay.models.registry import as_trained, build_model
    from voxrelay.train.strategies import apply_lora

    cfg = load_config(None, ["model.family=orpheus", "train.lora.r=4", *overrides])
    model = build_model(as_trained(cfg.model, cfg.train), DATA, 0)
    torch.manual_seed(1)
    apply_lora(model, cfg.train.lora)
    return model, cfg


@pytest.mark.parametrize(("precision", "base"), [("bf16", torch.bfloat16), ("fp16", torch.float16),
                                                  ("no", torch.float32)])
def test_the_frozen_base_is_in_the_compute_dtype_and_what_trains_in_float32(parts, precision, base) -> None:
    tok, _ = parts
    model, _ = _lora_model([f"model.tokenizer={tok}", f"train.precision={precision}", *TINY])
    params = dict(model.module.named_parameters())
    assert {p.dtype for p in params.values() if not p.requires_grad} == {base}
    trained = {n: p for n, p in params.items() if p.requires_grad}
    assert trained and {p.dtype for p in trained.values()} == {torch.float32}
    assert all("lora_" in n for n in trained), sorted(trained)  # random init: no token was added, none trains


def test_a_full_fine_tune_keeps_float32_master_weights(parts) -> None:
    from voxrelay.models.registry import as_trained

    tok, _ = parts
    cfg = load_config(None, ["model.family=orpheus", f"model.tokenizer={tok}", "train.precision=bf16"])
    assert as_trained(cfg.model, cfg.train).weights_dtype == "float32"
    pinned = load_config(None, ["model.family=orpheus", f"model.tokenizer={tok}", "train.precision=bf16",
                                "train.lora=true", "model.weights_dtype=float32"])
    assert as_trained(pinned.model, pinned.train).weights_dtype == "float32"


def test_only_the_rows_of_added_tokens_train_tied_to_the_head_and_peft_loads_the_export(parts, tmp_path) -> None:
    """From a plain Llama-3 (128,256 rows) Orpheus' 28,684 new rows train, nothing else of the tied embeddings; the
    adapter files peft writes apply to the (grown) upstream class and give voxrelay's outputs; the merged export
    holds the trained rows and the base's others, still tied."""
    import peft
    from transformers import LlamaForCausalLM

    from voxrelay.models.lora import save_adapter

    _, llama3 = parts
    model, _ = _lora_model([f"model.init_from={llama3}", "train.precision=bf16"])
    assert model.new_token_rows() == list(range(L.LLAMA3_VOCAB, L.VOCAB_SIZE))
    trained = {n: p for n, p in model.module.named_parameters() if p.requires_grad}
    rows = [p for n, p in trained.items() if "trainable_tokens_delta" in n]
    hidden = model.module.get_input_embeddings().weight.shape[1]
    assert len(rows) == 1 and rows[0].shape == (L.VOCAB_SIZE - L.LLAMA3_VOCAB, hidden)  # the head follows, tied
    assert all("lora_" in n or "trainable_tokens_delta" in n for n in trained), sorted(trained)
    assert {p.dtype for p in trained.values()} == {torch.float32}
    with torch.no_grad():
        for p in trained.values():
            p.add_(torch.randn_like(p) * 0.05)
    ids = torch.tensor([[L.BOS, 200, L.AUDIO_START + 5, L.VOCAB_SIZE - 3]])
    model.module.eval()
    with torch.no_grad():
        ours = model.module(input_ids=ids).logits.float()
    save_adapter(model.module, tmp_path / "adapter")
    upstream = LlamaForCausalLM.from_pretrained(str(llama3), dtype=torch.bfloat16)
    upstream.resize_token_embeddings(L.VOCAB_SIZE)  # as the family grows it (documented in the README)
    loaded = peft.PeftModel.from_pretrained(upstream, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        theirs = loaded(input_ids=ids).logits.float()
    assert torch.allclose(ours, theirs, atol=1e-2), (ours - theirs).abs().max()
    merged = loaded.merge_and_unload()
    emb = merged.get_input_embeddings().weight
    assert merged.lm_head.weight.data_ptr() == emb.data_ptr()
    assert torch.equal(emb[L.LLAMA3_VOCAB:], rows[0].detach().to(emb.dtype))
    base = LlamaForCausalLM.from_pretrained(str(llama3), dtype=torch.bfloat16).get_input_embeddings().weight
    assert torch.equal(emb[:L.LLAMA3_VOCAB], base)


def test_embeddings_full_trains_them_in_full_as_runs_did_before(parts) -> None:
    _, llama3 = parts
    model, _ = _lora_model([f"model.init_from={llama3}", "train.precision=no", "train.lora.embeddings=full"])
    trained = [n for n, p in model.module.named_parameters() if p.requires_grad]
    assert any(n.endswith("embed_tokens.modules_to_save.default.weight") for n in trained), trained
    assert not any("trainable_tokens" in n for n in trained)


def test_a_run_saved_before_these_defaults_resumes_as_it_trained(parts) -> None:
    """Its config holds weights_dtype float32 and no train.lora.embeddings (it trained embed_tokens/lm_head in
    full): this session's config leaving both unset goes on with those; one that sets them is refused as a change."""
    from voxrelay.config import config_changes
    from voxrelay.train.build import keep_started

    tok, _ = parts
    args = ["model.family=orpheus", f"model.tokenizer={tok}", "train.lora.r=4", "train.precision=bf16"]
    old = load_config(None, [*args, "model.weights_dtype=float32"]).to_dict()
    del old["train"]["lora"]["embeddings"]
    cfg = load_config(None, args)
    keep_started(cfg, old, main=False)
    assert (cfg.model.weights_dtype, cfg.train.lora.embeddings) == ("float32", "full")
    assert config_changes(old, cfg.to_dict()) == ([], [])
    explicit = load_config(None, [*args, "model.weights_dtype=auto", "train.lora.embeddings=new_rows"])
    keep_started(explicit, old, main=False)
    assert config_changes(old, explicit.to_dict())[1] == ["model.weights_dtype", "train.lora.embeddings"]
    new = load_config(None, args)
    same = load_config(None, args)
    keep_started(same, new.to_dict(), main=False)  # a run saved under the new defaults: nothing to keep
    assert same.to_dict() == new.to_dict()
