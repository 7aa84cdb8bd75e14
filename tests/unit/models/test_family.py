"""The family seam: the registry by `model.family`, and codec_lm reached only through it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from voxrelay.config import ConfigError, load_config
from voxrelay.data.shards import EncodedUtterance
from voxrelay.models.base import LOSS_COUNT, DataSpec, FamilyModel
from voxrelay.models.codec_lm.config import CodecLMConfig
from voxrelay.models.registry import FAMILIES, ModelFolderError, build_model, get_family, load_model

K, C = 2, 16
TINY = dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_seq_len=256)
DATA = DataSpec(K, C, ["a", "b"])


def tiny(seed: int = 0, **kw) -> FamilyModel:
    return build_model(CodecLMConfig(**{**TINY, **kw}), DATA, seed)


def row(text: str, frames: int, speaker: str | None = "a", seed: int = 0) -> EncodedUtterance:
    codes = np.random.default_rng(seed).integers(0, C, (K, frames)).astype(np.int16)
    return EncodedUtterance(f"id-{seed}", text, speaker, "a calm voice", frames / 10, codes)


def test_registry_and_config_union_name_the_same_families() -> None:
    from voxrelay.config import RunConfig

    union = {c.model_fields["family"].default for c in get_args(RunConfig.model_fields["model"].annotation)}
    assert union == set(FAMILIES) and len(FAMILIES) >= 4
    for name, spec in FAMILIES.items():
        assert get_family(name) is spec and spec.name == name
        assert spec.config.model_fields["family"].default == name
        assert callable(spec.builder()) and callable(spec.loader())


@pytest.mark.parametrize("where", ["registry", "config"])
def test_unknown_family_names_the_key_and_the_known_ones(where: str) -> None:
    with pytest.raises(ConfigError) as info:
        get_family("parlor") if where == "registry" else load_config(None, ["model.family=parlor"])
    msg = str(info.value)
    assert "model.family='parlor'" in msg and "codec_lm" in msg


def test_config_without_family_is_codec_lm_and_overrides_reach_it() -> None:
    cfg = load_config(None, ["model.hidden_size=64"])
    assert isinstance(cfg.model, CodecLMConfig) and cfg.model.family == "codec_lm" and cfg.model.hidden_size == 64
    assert cfg.to_dict()["model"]["family"] == "codec_lm"
    with pytest.raises(ConfigError, match=r"\n  model\.num_layers: .*\(got 'x'\)"):  # no union tag in the key
        load_config(None, ["model.num_layers=x"])


def test_codec_lm_through_the_seam_is_the_model_of_before() -> None:
    """Golden values measured with the code before the seam (CodecLM.build + encode_example)."""
    model = tiny()
    assert isinstance(model, FamilyModel) and model.family == "codec_lm"
    rng = np.random.default_rng(0)
    rows = [EncodedUtterance("x", "hello there", "a", None, 1.0, rng.integers(0, C, (K, 7))),
            EncodedUtterance("y", "hi", "b", None, 1.0, rng.integers(0, C, (K, 3)))]
    batch = model.collate([model.example(r) for r in rows])
    terms = model.loss(model.module, batch)
    loss_sum, n, _ = terms["ce"]
    assert int(n) == int(batch[LOSS_COUNT + "ce"]) == 22 and set(terms) == {"ce"}
    assert float(loss_sum.detach()) == pytest.approx(125.71351623535156, rel=1e-6)
    codes = model.generate("hello", speaker="b", max_frames=5, temperature=0.8, seed=1)
    assert codes.tolist() == [[0, 3, 15, 15, 9], [1, 13, 14, 11, 13]]


def test_example_length_and_loss_token_count() -> None:
    model = tiny()
    rows = [row("hello", 5, seed=1), row("a longer sentence", 9, "b", seed=2)]
    examples = [model.example(r) for r in rows]
    assert [model.length(r) for r in rows] == [len(e["input_ids"]) for e in examples]
    batch = model.collate(examples)
    # the causal shift lives in the family: position t predicts label t + 1
    assert int(batch[LOSS_COUNT + "ce"]) == int((batch["labels"][:, 1:] != -100).sum()) == (K * 5 + 1) + (K * 9 + 1)
    out = model.loss(model.module, batch)
    logits = model.module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    expect = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), batch["labels"][:, 1:].reshape(-1),
                             ignore_index=-100, reduction="sum")
    assert float(out["ce"].sum.detach()) == pytest.approx(float(expect.detach()), rel=1e-5)
    assert model.max_length == 256 and model.max_length_key == "model.max_seq_len"
    assert tiny(max_seq_len=20).length(rows[1]) > 20  # length does not refuse: the batch planner filters


def test_strategy_hooks() -> None:
    model = tiny()
    decay, no_decay = model.param_groups(0.05)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.05, 0.0)
    named = dict(model.module.named_parameters())
    assert {n for n, p in named.items() if any(p is q for q in no_decay["params"])} == \
        {n for n in named if "norm" in n}  # Llama's RMSNorm gains (it has no biases)
    assert len(decay["params"]) + len(no_decay["params"]) == len(named)
    model.module.lm_head.weight.requires_grad_(False)  # a frozen part is left out of the optimizer
    assert sum(len(g["params"]) for g in model.param_groups(0.0)) == len(named) - 1
    names = {name.rsplit(".", 1)[-1] for name, _ in model.module.named_modules()}
    lora = model.lora_defaults()
    assert lora.target_modules and set(lora.target_modules) <= names and set(lora.modules_to_save) <= names
    assert model.fsdp_layer_classes() == (LlamaDecoderLayer,)


def test_meta_build_has_the_shapes_of_the_real_one(tmp_path: Path) -> None:
    real, meta = tiny(), build_model(CodecLMConfig(**TINY), DATA, 0, meta=True)
    assert all(p.device.type == "meta" for p in meta.module.parameters())
    assert {k: v.shape for k, v in meta.module.state_dict().items()} == \
        {k: v.shape for k, v in real.module.state_dict().items()}
    lm = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2))
    lm.save_pretrained(str(tmp_path / "lm"))
    cfg = CodecLMConfig(**TINY, init_from=str(tmp_path / "lm"))
    real, meta = build_model(cfg, DATA, 0), build_model(cfg, DATA, 0, meta=True)
    count = lambda m: sum(p.numel() for p in m.module.parameters())  # noqa: E731
    assert count(meta) == count(real) and meta.module.config.vocab_size == real.module.config.vocab_size


def test_save_and_load_by_the_family_the_folder_names(tmp_path: Path) -> None:
    model = tiny(seed=3)
    model.save_pretrained(tmp_path / "m")
    again = load_model(tmp_path / "m")
    assert again.family == "codec_lm" and again.speakers == ["a", "b"]
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(model.module(input_ids=ids).logits, again.module(input_ids=ids).logits)
    meta = json.loads((tmp_path / "m" / "voxrelay.json").read_text())
    (tmp_path / "m" / "voxrelay.json").write_text(json.dumps({**meta, "family": "future_tts"}))
    with pytest.raises(ModelFolderError, match=r"model family 'future_tts'.*known: .*codec_lm"):
        load_model(tmp_path / "m")
