"""`voxrelay export --adapter-only` is loaded by the loader it claims: ``peft.PeftModel.from_pretrained`` on the
family's transformers class (``VibeVoiceForConditionalGeneration``, Orpheus' ``LlamaForCausalLM``) built from the
base checkpoint, and ``AutoPeftModel`` from the folder alone; both give the weights and outputs voxrelay's own
load gives, which are the trained ones. voxrelay still reads adapter exports written before (peft's files of
its own wrapper, keys ``base_model.model.net.…``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.helpers.orpheus import save_llama3_tokenizer, save_tiny_llama
from tests.helpers.vibevoice import save_tiny_vibevoice
from voxrelay.codecs.pcm import PcmCodec
from voxrelay.models.base import DataSpec

CASES = {"vibevoice": ("VibeVoiceForConditionalGeneration", DataSpec(1, 65536, [], 24000.0, 24000)),
         "orpheus": ("LlamaForCausalLM", DataSpec(7, 4096, ["tara"], 11.71875, 24000))}


def _base(family: str, folder: Path) -> Path:
    if family == "vibevoice":
        return save_tiny_vibevoice(folder / "vibevoice")
    return save_tiny_llama(folder / "orpheus", save_llama3_tokenizer(folder / "tokenizer"))


def _trained_lora(family: str, init_from: Path):
    """The family's model with LoRA (r=4) whose adapters and fully trained copies hold random values, as after
    training, and the note an adapter-only export keeps."""
    from voxrelay.config import load_config
    from voxrelay.models.lora_config import LoraConfig
    from voxrelay.models.registry import build_model
    from voxrelay.train.strategies import apply_lora, base_hash, describe_base

    cfg = load_config(None, [f"model.family={family}", f"model.init_from={init_from}"]).model
    data = CASES[family][1]
    model = build_model(cfg, data, 0)
    note = {"base": describe_base(cfg, 0), "base_hash": base_hash(model.module), "seed": 0,
            "model": cfg.model_dump(mode="json"), "data": data.to_note()}
    torch.manual_seed(1)
    apply_lora(model, LoraConfig(r=4))
    with torch.no_grad():
        for p in model.module.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    return model, note


def _merged(module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.merge_and_unload().state_dict().items()}


@pytest.mark.parametrize("family", ["vibevoice", "orpheus"])
def test_an_adapter_only_export_is_applied_by_peft_to_the_transformers_class(family, tmp_path):
    import peft
    import transformers

    from voxrelay.inference import export, load_from_export

    init_from = _base(family, tmp_path)
    model, note = _trained_lora(family, init_from)
    out = export(model, PcmCodec(24000), tmp_path / "adapter", note, adapter_only=True)
    config = json.loads((out / "adapter_config.json").read_text())
    cls_name = CASES[family][0]
    assert config["auto_mapping"]["base_model_class"] == cls_name
    assert config["base_model_name_or_path"] == str(init_from)
    cls = getattr(transformers, cls_name)
    ids = torch.tensor([[1, 5, 9, 3, 3, 2, 7]])

    ours, _ = load_from_export(str(out))
    inner = ours.net if family == "vibevoice" else ours.module  # the transformers model inside voxrelay's
    theirs = peft.PeftModel.from_pretrained(cls.from_pretrained(str(init_from)), str(out))
    auto = peft.AutoPeftModel.from_pretrained(str(out))  # the base class and folder named by the adapter's config
    with torch.no_grad():
        expected = inner(input_ids=ids).logits
        assert torch.allclose(theirs(input_ids=ids).logits, expected, atol=1e-5)
        assert torch.allclose(auto(input_ids=ids).logits, expected, atol=1e-5)
    merged = _merged(theirs)
    trained = _merged(model.module)
    prefix = "net." if family == "vibevoice" else ""
    assert {k[len(prefix):]: v for k, v in trained.items() if k.startswith(prefix)}.keys() == merged.keys()
    assert all(torch.allclose(trained[prefix + k], v, atol=1e-6) for k, v in merged.items())
    base = cls.from_pretrained(str(init_from)).state_dict()
    assert sum(not torch.equal(base[k], v) for k, v in merged.items()) > 4  # the adapters and copies took effect


def test_an_adapter_export_of_the_older_layout_still_loads(tmp_path):
    """Before, the adapter files were peft's of voxrelay's wrapper (``base_model.model.net.…``)."""
    from safetensors import safe_open

    from voxrelay.inference import export, load_from_export

    model, note = _trained_lora("vibevoice", _base("vibevoice", tmp_path))
    new = export(model, PcmCodec(24000), tmp_path / "new", note, adapter_only=True)
    old = tmp_path / "old"
    shutil.copytree(new, old)
    model.module.save_pretrained(str(old))  # what f975e76's export wrote
    with safe_open(str(old / "adapter_model.safetensors"), "pt") as f:
        assert all(k.startswith("base_model.model.net.") for k in f.keys())
    a, b = _merged(load_from_export(str(new))[0].module), _merged(load_from_export(str(old))[0].module)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_loaded_adapter_is_not_said_to_train(tmp_path, caplog):
    """Training says what trains; synthesize/eval/export, which load the adapters (``training=False``), say what
    the adapters hold instead of "training N of M parameters"."""
    import logging

    from voxrelay.config import load_config
    from voxrelay.models.lora_config import LoraConfig
    from voxrelay.models.registry import build_model
    from voxrelay.train.strategies import apply_lora

    cfg = load_config(None, ["model.family=orpheus", f"model.init_from={_base('orpheus', tmp_path)}"]).model
    said = {}
    for training in (True, False):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="voxrelay.models.lora"):
            apply_lora(build_model(cfg, CASES["orpheus"][1], 0), LoraConfig(r=4), training=training)
        said[training] = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("LoRA r=4"))
    assert "; training " in said[True] and "; training " not in said[False]
    assert said[False].split("; ")[-1].startswith("adapters and trained modules: ")
    assert said[True].split(" of ")[-1] == said[False].split(" of ")[-1]  # the same count of the same parameters
