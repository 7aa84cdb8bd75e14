"""LoRA through the family seam (train/strategies.py): family defaults fill unset keys, only adapters and
modules_to_save train, the family's loss and KV-cached generate work through the PeftModel, tied
embeddings stay tied, the checkpoint state round-trips and is refused when it does not fit, and the base
hash tells bases apart."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from voxrelay.checkpoint.frozen import (
    HASH_SAMPLE,
    BaseModelChangedError,
    base_hash,
    check_base,
    load_trainable,
    trainable_state,
)
from voxrelay.checkpoint.store import CheckpointError
from voxrelay.data.shards import EncodedUtterance
from voxrelay.models.base import DataSpec, FamilyModel, LoraDefaults, pop_counts
from voxrelay.models.codec_lm.config import CodecLMConfig
from voxrelay.models.lora_config import LoraConfig
from voxrelay.models.registry import build_model
from voxrelay.train.strategies import LoraSettingsError, apply_lora, lora_settings, ties_embeddings

K, C = 2, 16
TINY = dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_seq_len=256)
DATA = DataSpec(K, C, ["a", "b"])


def codec_lm(seed: int = 0) -> FamilyModel:
    return build_model(CodecLMConfig(**TINY), DATA, seed)


def batch(model: FamilyModel) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(0)
    rows = [EncodedUtterance(f"r{i}", text, "a", None, 1.0, rng.integers(0, C, (K, 6)).astype(np.int16))
            for i, text in enumerate(["hello there", "a quiet river"])]
    out = model.collate([model.example(r) for r in rows])
    pop_counts(out)
    return out


def perturb_adapters(module: torch.nn.Module, seed: int = 1) -> None:
    """lora_B starts at zero (the adapted model equals its base): give the adapters an effect."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def test_unset_keys_take_the_family_defaults_and_only_adapters_train():
    model = codec_lm()
    defaults = model.lora_defaults()
    settings = lora_settings(model, LoraConfig(r=4, modules_to_save=[]))
    assert settings == {"r": 4, "alpha": defaults.alpha, "dropout": defaults.dropout, "rslora": defaults.rslora,
                        "target_modules": defaults.target_modules, "modules_to_save": [], "base_bits": None,
                        "embeddings": "new_rows"}
    base_params = sum(p.numel() for p in model.module.parameters())
    apply_lora(model, LoraConfig(r=4, modules_to_save=[]))
    trained = trainable_state(model.module)
    assert trained and all(".lora_A." in k or ".lora_B." in k for k in trained)
    # an A and a B for each of the family's target projections in each layer
    assert len(trained) == 2 * len(defaults.target_modules) * TINY["num_layers"]
    assert all(t.shape[0] == 4 or t.shape[1] == 4 for t in trained.values())
    frozen = sum(p.numel() for p in model.module.parameters() if not p.requires_grad)
    assert frozen == base_params


def test_modules_to_save_train_in_full_beside_the_adapters():
    model = codec_lm()
    apply_lora(model, LoraConfig(r=4, embeddings="full"))  # codec_lm's embeddings in full: lm_head, embed_tokens
    full = [k for k in trainable_state(model.module) if ".modules_to_save." in k]
    assert sorted(k.split(".modules_to_save")[0].rsplit(".", 1)[-1] for k in full) == ["embed_tokens", "lm_head"]


def test_loss_and_kv_cached_generate_work_through_the_peft_model():
    plain, model = codec_lm(), codec_lm()
    apply_lora(model, LoraConfig(r=4, dropout=0.0))
    assert type(model.module).__name__ == "PeftModel"
    b = batch(plain)
    # lora_B starts at zero: the adapted model is its base, in the loss and in generation
    with torch.no_grad():
        assert torch.equal(model.loss(model.module, b)["ce"].sum, plain.loss(plain.module, b)["ce"].sum)
    same = plain.generate("hello", speaker="a", max_frames=12, temperature=0)
    np.testing.assert_array_equal(model.generate("hello", speaker="a", max_frames=12, temperature=0), same)
    perturb_adapters(model.module)
    with torch.no_grad():
        assert not torch.equal(model.loss(model.module, b)["ce"].sum, plain.loss(plain.module, b)["ce"].sum)
    codes = model.generate("hello", speaker="a", max_frames=12, temperature=0)
    assert not np.array_equal(codes, same)
    # the PeftModel's KV-cached decoding agrees with the same weights merged into a plain Llama
    model.module = model.module.merge_and_unload()
    assert type(model.module) is LlamaForCausalLM
    np.testing.assert_array_equal(model.generate("hello", speaker="a", max_frames=12, temperature=0), codes)


class TiedLM:
    """A family model whose Llama ties lm_head to embed_tokens (as Orpheus' does)."""

    family = "tied_test"

    def __init__(self) -> None:
        cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
        torch.manual_seed(0)
        self.module = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")

    def lora_defaults(self) -> LoraDefaults:
        return LoraDefaults(r=4, alpha=8, dropout=0.0, rslora=True, target_modules=["q_proj", "v_proj"],
                            modules_to_save=["lm_head", "embed_tokens"])


def test_tied_embeddings_stay_tied_and_train_once():
    model = TiedLM()
    assert ties_embeddings(model.module) and not ties_embeddings(codec_lm().module)
    emb_size = model.module.get_input_embeddings().weight.numel()
    apply_lora(model, LoraConfig())
    trained = trainable_state(model.module)
    adapters = sum(t.numel() for k, t in trained.items() if ".lora_" in k)
    assert sum(t.numel() for t in trained.values()) == adapters + emb_size  # one copy, not two
    opt = torch.optim.AdamW([p for p in model.module.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.arange(10).unsqueeze(0)
    model.module(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    inner = model.module.get_base_model()
    emb = inner.get_input_embeddings().modules_to_save["default"].weight
    head = inner.get_output_embeddings().modules_to_save["default"].weight
    assert emb is head
    assert not torch.equal(emb, inner.get_input_embeddings().original_module.weight)  # it did train


def test_trainable_state_round_trips_and_a_state_that_does_not_fit_is_refused():
    trained = codec_lm()
    apply_lora(trained, LoraConfig(r=4))
    perturb_adapters(trained.module)
    state = {k: v.detach().clone() for k, v in trainable_state(trained.module).items()}
    fresh = codec_lm()
    apply_lora(fresh, LoraConfig(r=4))
    load_trainable(fresh.module, state, "checkpoint X")
    assert all(torch.equal(trainable_state(fresh.module)[k], v) for k, v in state.items())
    b = batch(fresh)
    with torch.no_grad():
        assert torch.equal(fresh.loss(fresh.module, b)["ce"].sum, trained.loss(trained.module, b)["ce"].sum)
    lacking = dict(state)
    gone = next(k for k in lacking if "lora_A" in k)
    del lacking[gone]
    with pytest.raises(CheckpointError, match=r"checkpoint X does not hold the trained weights.*1 trained tensors"):
        load_trainable(fresh.module, lacking, "checkpoint X")
    with pytest.raises(CheckpointError, match=r"1 not trained here .*'extra.weight'"):
        load_trainable(fresh.module, state | {"extra.weight": torch.zeros(1)}, "checkpoint X")


def test_target_modules_that_match_nothing_name_the_key_and_real_names():
    model = codec_lm()
    with pytest.raises(LoraSettingsError, match=r"train.lora does not fit this codec_lm model.*'q_proj'"):
        apply_lora(model, LoraConfig(target_modules=["attention.query"]))


def test_base_hash_tells_bases_apart():
    a, b = codec_lm(seed=0).module, codec_lm(seed=1).module
    assert base_hash(a) == base_hash(codec_lm(seed=0).module)
    assert base_hash(a) != base_hash(b)
    weight = a.get_input_embeddings().weight
    assert weight.numel() > 2 * HASH_SAMPLE  # so the element changed below lies between sampled ones
    before = base_hash(a)
    stride = weight.numel() // HASH_SAMPLE
    with torch.no_grad():
        weight.view(-1)[stride + stride // 2] += 1e-3  # one weight, not in the strided sample
    assert base_hash(a) != before
    with torch.no_grad():
        weight.copy_(weight.roll(1, dims=1))  # the same values in another order: the sum is unchanged
    assert base_hash(a) != before
    a.requires_grad_(False)
    a.eval()
    assert base_hash(a) == base_hash(a.train())  # a property of the weights only


def test_check_base_names_both_hashes():
    check_base("abc", "abc", "model.init_from='x'", "resume", "fix it")
    with pytest.raises(BaseModelChangedError, match=r"resume: .*hash abc, but model.init_from='x' now gives a base "
                       r"with hash def .*; fix it"):
        check_base("abc", "def", "model.init_from='x'", "resume", "fix it")
