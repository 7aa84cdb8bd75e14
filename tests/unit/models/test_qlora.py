"""QLoRA (``train.lora.base_bits``) through the family seam on tiny real models: the frozen Linears of the layers
become bitsandbytes' NF4 / int8 ones (head, embeddings, adapters and what trains in full untouched), gradients
reach the adapters through them, ``plan`` counts their bytes exactly; a merged export loads in the upstream
class and computes what the quantised model computed, the adapter alone loads with peft on the upstream class
quantised by transformers itself (how a QLoRA user loads it); missing bitsandbytes and FSDP are refused by name.
Training and resuming bit for bit: tests/unit/train/test_plan_combinations.py (the plan's QLoRA rows)."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.helpers.orpheus import save_llama3_tokenizer, save_tiny_llama
from tests.helpers.vibevoice import save_tiny_vibevoice
from voxrelay.codecs.pcm import PcmCodec
from voxrelay.models.base import DataSpec
from voxrelay.models.lora_config import LoraConfig

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

bnb = pytest.importorskip("bitsandbytes")

DATA = {"vibevoice": DataSpec(1, 65536, [], 24000.0, 24000), "orpheus": DataSpec(7, 4096, ["tara"], 11.71875, 24000),
        "codec_lm": DataSpec(2, 16, ["a", "b"])}
IDS = torch.tensor([[1, 5, 9, 3, 3, 2, 7, 11]])


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, list[str]]:
    """Config overrides of a tiny base model per family (real transformers classes, random init)."""
    folder = tmp_path_factory.mktemp("qlora-bases")
    llama = save_tiny_llama(folder / "orpheus", save_llama3_tokenizer(folder / "tokenizer"))
    return {"orpheus": ["model.family=orpheus", f"model.init_from={llama}"],
            "vibevoice": ["model.family=vibevoice", f"model.init_from={save_tiny_vibevoice(folder / 'vibevoice')}"],
            "codec_lm": ["model.family=codec_lm", "model.hidden_size=64", "model.num_layers=2", "model.num_heads=4",
                         "model.intermediate_size=128"]}


def _model(family: str, overrides: list[str], bits: int | None, seed: int = 1):
    """The family's model with LoRA (r=4) on a base quantised to ``bits``, its adapters and fully trained copies
    moved off their init (as after training), and the note an adapter-only export keeps."""
    from voxrelay.config import load_config
    from voxrelay.models.registry import build_model
    from voxrelay.train.strategies import apply_lora, base_hash, describe_base

    cfg = load_config(None, overrides).model
    model = build_model(cfg, DATA[family], 0)
    note = {"base": describe_base(cfg, 0), "base_hash": base_hash(model.module), "seed": 0,
            "model": cfg.model_dump(mode="json"), "data": DATA[family].to_note(),
            **({"base_bits": bits} if bits else {})}
    torch.manual_seed(seed)
    # codec_lm here is a random init: no pretrained rows to keep, its embeddings and head train in full (as its
    # from-scratch runs do); with them frozen at their random init the tiny model's NF4 error is ~17% of its logits
    embeddings = "full" if family == "codec_lm" else "new_rows"
    apply_lora(model, LoraConfig(r=4, base_bits=bits, embeddings=embeddings))
    with torch.no_grad():
        for p in model.module.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    return model, note


def _lm(model):
    """The transformers causal LM inside the family's module (VibeVoice's is under ``net``)."""
    return model.module.get_base_model().get_submodule(model.upstream_prefix.rstrip(".")) if model.upstream_prefix \
        else model.module


def _quant_bytes(module: torch.nn.Module) -> int:
    """Bytes bitsandbytes holds for ``module``'s quantised weights: the codes and their quantisation state."""
    total = 0
    for m in module.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            qs = m.weight.quant_state
            parts = [m.weight.data, qs.absmax, qs.code, qs.offset, qs.state2.absmax, qs.state2.code]
        elif isinstance(m, bnb.nn.Linear8bitLt):
            parts = [m.weight.data, m.weight.SCB if m.weight.SCB is not None else m.state.SCB]
        else:
            continue
        total += sum(t.numel() * t.element_size() for t in parts)
    return total


# int8 on two families (and trained, resumed and exported in the other tests); NF4 on each
@pytest.mark.parametrize(("family", "bits"), [("orpheus", 4), ("orpheus", 8), ("vibevoice", 4), ("codec_lm", 4),
                                              ("codec_lm", 8)])
def test_the_frozen_layer_linears_are_quantised_and_the_adapters_train_through_them(family, bits, bases):
    from voxrelay.models.qlora import frozen_linears
    from voxrelay.plan.formulas import quantised_params, weight_bytes
    from voxrelay.plan.model import collect
    from voxrelay.train.strategies import trainable_state

    plain, _ = _model(family, bases[family], None)
    layers = plain.fsdp_layer_classes()
    expected = {f"{id(parent)}.{name}" for parent, name in frozen_linears(plain.module, layers)}
    params, _ = collect(plain.module, layers)
    model, _ = _model(family, bases[family], bits)
    kind = bnb.nn.Linear4bit if bits == 4 else bnb.nn.Linear8bitLt
    quantised = [m for m in model.module.modules() if isinstance(m, kind)]
    assert len(quantised) == len(expected) >= 7  # every projection of every layer (the adapted ones too)
    inner = _lm(model)
    for part in (inner.get_input_embeddings(), inner.get_output_embeddings()):
        assert not isinstance(part, kind) and part.weight.dtype == torch.float32  # the head and embeddings as built
    assert trainable_state(model.module).keys() == trainable_state(plain.module).keys()  # what trains is unchanged
    assert all(p.dtype == torch.float32 for p in trainable_state(model.module).values())
    # plan's count of the quantised layout (from shapes alone) is the bytes bitsandbytes holds, to the byte
    kept = weight_bytes([p for p in params if not p.quantisable])
    assert weight_bytes(quantised_params(params, bits)) - kept == _quant_bytes(model.module)
    assert _quant_bytes(model.module) < 4 * sum(p.numel for p in params if p.quantisable) / 2.5  # of fp32
    # a step: the loss reaches every adapter through the quantised layers; the quantised model is close to the plain
    # one (same adapters) and not equal to it
    model.module.train(), plain.module.train()
    out = inner(input_ids=IDS, labels=IDS)
    out.loss.backward()
    adapters = {k: p for k, p in model.module.named_parameters() if ".lora_" in k}
    assert adapters and all(p.grad is not None and p.grad.abs().sum() > 0 for p in adapters.values())
    model.module.eval(), plain.module.eval()
    with torch.no_grad():
        ours, theirs = inner(input_ids=IDS).logits, _lm(plain)(input_ids=IDS).logits
    assert not torch.equal(ours, theirs) and (ours - theirs).norm() < 0.1 * theirs.norm()  # measured 0.001-0.05


def test_quantising_the_same_base_twice_gives_the_same_weights_and_evaluation_leaves_them(bases):
    """What makes a resume exact: each session quantises the base it rebuilt, and gets the same bits; an evaluation
    in between (eval mode, no grad: where bitsandbytes would repack a CPU weight for inference) changes nothing."""
    a, _ = _model("orpheus", bases["orpheus"], 4)
    b, _ = _model("orpheus", bases["orpheus"], 4)
    a.module.eval()
    with torch.no_grad():
        a.module(input_ids=IDS)
    qa = [m for m in a.module.modules() if isinstance(m, bnb.nn.Linear4bit)]
    qb = [m for m in b.module.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert qa and all(torch.equal(x.weight.data, y.weight.data)
                      and torch.equal(x.weight.quant_state.absmax, y.weight.quant_state.absmax)
                      for x, y in zip(qa, qb, strict=True))


@pytest.mark.parametrize("bits", [4, 8])
def test_a_merged_export_is_the_dequantised_base_with_the_adapters_in_the_upstream_class(bits, bases, tmp_path):
    from transformers import LlamaForCausalLM

    from voxrelay.inference import export

    model, note = _model("orpheus", bases["orpheus"], bits)
    with torch.no_grad():
        expected = model.module(input_ids=IDS).logits
    out = export(model, PcmCodec(24000), tmp_path / "merged", note)
    loaded = LlamaForCausalLM.from_pretrained(str(out))
    assert not any("lora" in k or "absmax" in k or k.endswith(".SCB") for k in loaded.state_dict())
    assert all(p.dtype == torch.float32 for p in loaded.parameters())  # the base's dtype (model.weights_dtype)
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=IDS).logits, expected, atol=1e-4)


def test_an_adapter_only_export_loads_with_peft_on_the_upstream_class_quantised_by_transformers(bases, tmp_path):
    """The QLoRA user's own load: ``from_pretrained(base, quantization_config=BitsAndBytesConfig(4-bit NF4, double
    quantisation))`` + ``PeftModel.from_pretrained``: the outputs voxrelay computed; voxrelay's own load of the
    export re-quantises its base too."""
    import peft
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    from voxrelay.inference import export, load_from_export

    model, note = _model("orpheus", bases["orpheus"], 4)
    with torch.no_grad():
        expected = model.module(input_ids=IDS).logits
    out = export(model, PcmCodec(24000), tmp_path / "adapter", note, adapter_only=True)
    init_from = bases["orpheus"][1].split("=", 1)[1]
    quantised = LlamaForCausalLM.from_pretrained(init_from, device_map="cpu", quantization_config=BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float32))
    theirs = peft.PeftModel.from_pretrained(quantised, str(out)).train()  # no dropout here; in eval mode on a CPU
    # with AVX512-BF16 bitsandbytes would repack its weights with bf16 absmax for inference (and fails below 64 wide)
    ours, _ = load_from_export(str(out))
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in ours.module.modules())
    with torch.no_grad():
        assert torch.allclose(theirs(input_ids=IDS).logits, expected, atol=1e-5)
        assert torch.equal(ours.module(input_ids=IDS).logits, expected)


def test_without_bitsandbytes_the_error_names_the_extra(bases, monkeypatch):
    from voxrelay.config import load_config
    from voxrelay.errors import UserError
    from voxrelay.models.qlora import QuantisationError
    from voxrelay.models.registry import build_model
    from voxrelay.train.optim import check_available
    from voxrelay.train.strategies import apply_lora

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import bitsandbytes raises ImportError
    cfg = load_config(None, [*bases["codec_lm"], "train.lora.base_bits=4"])
    assert issubclass(QuantisationError, UserError)  # the CLI's exit 2, no traceback
    with pytest.raises(QuantisationError, match=r"train.lora.base_bits=4 .*`pip install voxrelay\[bnb\]`"):
        check_available(cfg.train)  # before data and weights are loaded
    model = build_model(cfg.model, DATA["codec_lm"], 0)
    with pytest.raises(QuantisationError, match=r"pip install voxrelay\[bnb\]"):
        apply_lora(model, cfg.train.lora)
    assert not hasattr(model.module, "peft_config")  # refused before peft wrapped anything


def test_fsdp_with_a_quantised_base_is_refused_naming_the_keys():
    from voxrelay.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"train.lora.base_bits=4 does not work under train.strategy=fsdp"):
        load_config(None, ["train.strategy=fsdp", "train.lora.base_bits=4"])
    assert load_config(None, ["train.strategy=ddp", "train.lora.base_bits=8"]).train.lora.base_bits == 8


def test_base_bits_allows_4_or_8_only():
    from voxrelay.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"train.lora.base_bits"):
        load_config(None, ["train.lora.base_bits=2"])


@pytest.mark.parametrize("start", [[], ["train.lora.r=8"], ["train.lora.base_bits=8"]])
def test_the_plan_advises_qlora_as_overrides_that_give_its_row(start):
    """What ``plan``/an OOM advise (``overrides``) turns the config into the QLoRA row, and back."""
    from voxrelay.config import load_config
    from voxrelay.plan import Strategy, configured
    from voxrelay.plan.fit import overrides

    cfg = load_config(None, start)
    for st in (Strategy("ddp", 1, True, "adamw", gradient_checkpointing=True, base_bits=4),
               Strategy("ddp", 1, True, "adamw"), Strategy("ddp", 1, False, "adamw")):
        if st == configured(cfg, 1):
            continue
        advised = load_config(None, [*start, *overrides(st, cfg).split()])
        assert configured(advised, 1) == st, (start, overrides(st, cfg))


def test_parler_quantises_its_decoder_and_frozen_t5_and_trains_its_adapters(tmp_path):
    """Parler-TTS: the decoder layers' and the frozen T5 blocks' Linears (both its FSDP units) in NF4 but T5's `wo`,
    the loss reaches the adapters; dequantised and merged, the model computes what the quantised one did (with
    `wo` quantised it did not: T5 cast its input to the packed weight's uint8)."""
    from tests.helpers.parler import save_parts
    from tests.unit.models.test_parler_family import _build, _rows
    from voxrelay.models.base import pop_counts
    from voxrelay.train.strategies import apply_lora, trainable_state

    model = _build(save_parts(tmp_path), "model.dropout=0")
    torch.manual_seed(0)
    apply_lora(model, LoraConfig(base_bits=4))
    quantised = [n for n, m in model.module.named_modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert any(".decoder.layers." in n for n in quantised) and any("text_encoder." in n for n in quantised)
    assert not any("lm_heads" in n or "embed" in n for n in quantised)
    assert not any(n.endswith(".wo") for n in quantised)  # T5 keeps it in float (it casts its input to its dtype)
    trained = trainable_state(model.module)
    with torch.no_grad():  # B starts at 0: give the adapters an effect, as after a few steps
        for k, v in trained.items():
            if "lora_B" in k:
                v.normal_(0, 0.1)
    batch = model.collate([model.example(r) for r in _rows()])
    pop_counts(batch)
    terms = model.loss(model.module, batch)
    sum(t.weight * t.sum / t.count for t in terms.values()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for k, p in trained.items() if "lora_A" in k)
    from voxrelay.models.qlora import dequantise_base

    model.module.eval()  # no adapter dropout
    with torch.no_grad():
        before = sum(float(t.sum) for t in model.loss(model.module, batch).values())
        assert dequantise_base(model.module) == len(quantised)
        model.module = model.module.merge_and_unload()
        after = sum(float(t.sum) for t in model.loss(model.module, batch).values())
    assert after == pytest.approx(before, rel=1e-5)


def test_the_run_counts_the_quantised_base_by_its_weights_not_its_packed_bytes(bases, caplog):
    """NF4 packs two weights per byte: "training X of Y parameters" counts the weights, as without QLoRA."""
    import logging
    import re

    def logged_total(bits):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="voxrelay.models.lora"):
            _model("orpheus", bases["orpheus"], bits)
        line = next(r.getMessage() for r in caplog.records if "parameters (" in r.getMessage())
        return int(re.search(r"of ([\d,]+) parameters", line).group(1).replace(",", ""))

    assert logged_total(4) == logged_total(None)
