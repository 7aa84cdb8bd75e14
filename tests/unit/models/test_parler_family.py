"""The ``parler`` family through the seam: examples and per-codebook loss terms, the frozen T5, speaking from a
description, saving and loading, and ``init_from`` an upstream folder (the committed fixture made by upstream's
own code) or a config-only one (planning)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.parler import save_parts
from voxrelay.models.base import DataSpec, Request, pop_counts

FIXTURE = Path(__file__).parents[2] / "fixtures" / "parler"


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> dict[str, Path]:
    return save_parts(tmp_path_factory.mktemp("parler-parts"))


def _cfg(parts: dict[str, Path], *extra: str):
    from voxrelay.config import load_config

    return load_config(None, ["model.family=parler", "model.preset=tiny", f"model.text_encoder={parts['text_encoder']}",
                              f"model.prompt_tokenizer={parts['prompt_tokenizer']}", *extra]).model


def _build(parts, *extra: str, data: DataSpec = DataSpec(9, 1024), meta: bool = False):
    from voxrelay.models.registry import build_model

    return build_model(_cfg(parts, *extra), data, seed=0, meta=meta)


def _rows(n: int = 2) -> list:
    rng = np.random.default_rng(0)
    texts = [("hello there", 5, "A calm voice."), ("the quick brown fox", 9, "A man speaks quickly.")]
    return [SimpleNamespace(id=f"r{i}", text=t, speaker=None, description=d, codes=rng.integers(0, 1024, (9, f)))
            for i, (t, f, d) in enumerate(texts[:n])]


def _dac(parts):
    from voxrelay.codecs.dac import DacCodec

    return DacCodec.from_pretrained(str(parts["dac"]))


def test_one_loss_term_per_codebook_counted_by_collate_and_weighted_to_upstreams_mean(parts):
    from voxrelay.models.parler import delay

    model = _build(parts, "model.dropout=0")
    model.module.eval()
    batch = model.collate([model.example(r) for r in _rows()])
    counts = pop_counts(batch)
    terms = model.loss(model.module, batch)
    assert list(terms) == [f"codebook_{k}" for k in range(9)] == list(counts)
    assert [int(t.count) for t in terms.values()] == list(counts.values())
    assert counts["codebook_0"] == 5 + 1 + 9 + 1  # each row's frames and its one EOS
    sums = torch.stack([t.sum for t in terms.values()])
    objective = sum(t.weight * float(t.sum) / int(t.count) for t in terms.values())
    upstream = float(delay.mean_of_means(sums.detach(), torch.tensor(list(counts.values()))))
    assert objective == pytest.approx(upstream, rel=1e-6)
    weighted = _build(parts, "model.codebook_weights=[2,1,1,1,1,1,1,1,1]")
    assert [t.weight for t in weighted.loss(weighted.module, batch).values()][:2] == [0.2, 0.1]


def test_the_description_encoder_is_frozen_and_its_rows_left_padded_prompts(parts):
    model = _build(parts)
    assert not any(p.requires_grad for p in model.module.text_encoder.parameters())
    assert all(p.requires_grad for n, p in model.module.named_parameters() if not n.startswith("text_encoder"))
    batch = model.collate([model.example(r) for r in _rows()])
    assert batch["prompt_mask"][0, 0] == 0 and batch["prompt_mask"][0, -1] == 1  # left-padded, as upstream trains
    assert batch["description_mask"][0, 0] == 1 and batch["description_mask"][0, -1] == 0  # right-padded
    assert model.length(_rows()[1]) == batch["prompt_mask"][1].sum() + 9 + 9
    unfrozen = _build(parts, "model.freeze_text_encoder=false")
    assert all(p.requires_grad for p in unfrozen.module.parameters())


def test_speaks_from_a_description_reproducibly_and_a_saved_folder_speaks_the_same(parts, tmp_path):
    from voxrelay.models.base import RequestError
    from voxrelay.models.registry import load_model

    model, codec = _build(parts), _dac(parts)
    request = Request("hello there", description="A calm voice.")
    first = model.speak(request, codec, max_frames=12, seed=3)
    assert 1 <= first.frames <= 12 and first.sample_rate == 44100 and len(first.wav) == first.frames * 512
    assert np.array_equal(model.speak(request, codec, max_frames=12, seed=3).wav, first.wav)
    with pytest.raises(RequestError, match="has no description"):
        model.speak(Request("hello there"), codec, max_frames=4)
    model.save_pretrained(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["model_type"] == "parler_tts" and config["decoder"]["num_codebooks"] == 9
    loaded = load_model(tmp_path / "saved")
    assert np.array_equal(loaded.speak(request, codec, max_frames=12, seed=3).wav, first.wav)


def test_init_from_the_upstream_fixture_loads_upstreams_weights(parts):
    from safetensors.torch import load_file

    model = _build(parts, f"model.init_from={FIXTURE}", f"model.description_tokenizer={parts['prompt_tokenizer']}")
    saved = load_file(str(FIXTURE / "model.safetensors"))
    state = model.module.state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved.items())
    assert model.config.decoder.hidden_size == 16 and model.config.prompt_vocab_size == 80


def test_init_from_checks_the_data_and_the_architecture(parts, tmp_path):
    from voxrelay.models.parler.loading import ParlerLoadError

    with pytest.raises(ParlerLoadError, match="predicts 9 codebooks of 1024 codes, but the prepared data has 4 x 1024"):
        _build(parts, f"model.init_from={FIXTURE}", data=DataSpec(4, 1024))
    other = tmp_path / "llama"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ParlerLoadError, match="model_type='llama', not 'parler_tts'"):
        _build(parts, f"model.init_from={other}")


def test_a_config_only_folder_builds_on_meta_for_planning(parts, tmp_path):
    folder = tmp_path / "config-only"
    folder.mkdir()
    shutil.copy(FIXTURE / "config.json", folder / "config.json")
    model = _build(parts, f"model.init_from={folder}", meta=True)
    assert all(p.device.type == "meta" for p in model.module.parameters())
    assert model.config.decoder.num_codebooks == 9


def test_export_in_upstreams_format_holds_upstreams_names(parts, tmp_path):
    """Our export of the upstream fixture's weights has exactly upstream's non-DAC tensors (names, values; the DAC
    in either of upstream's layouts: test_parler_export_dac.py); `scripts/parler_upstream.py check-export` loads
    such a folder in upstream's own code (not run here: it needs parler-tts' pinned environment)."""
    from safetensors.torch import load_file

    from voxrelay.inference import export
    from voxrelay.models.parler.keymap import config_from_upstream

    model = _build(parts, f"model.init_from={FIXTURE}", f"model.description_tokenizer={parts['prompt_tokenizer']}")
    export(model, _dac(parts), tmp_path / "up", fmt="parler")
    saved, theirs = load_file(str(tmp_path / "up" / "model.safetensors")), load_file(str(FIXTURE / "model.safetensors"))
    ours = {k: v for k, v in saved.items() if not k.startswith("audio_encoder.")}
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert any(k.startswith("audio_encoder.") for k in saved)
    config = json.loads((tmp_path / "up" / "config.json").read_text())
    back = config_from_upstream(config)
    assert (back.decoder, back.text_encoder, back.prompt_vocab_size) == (model.config.decoder,
                                                                         model.config.text_encoder, 80)
    assert (tmp_path / "up" / "tokenizer_config.json").is_file()


def test_plan_of_seed_000s_run_needs_only_a_config_json(tmp_path):
    """`voxrelay plan` on a folder holding only mini-v0.1's config.json (no weights, no tokenizer, no download):
    the family's shapes (T5-base encoder, 24-layer decoder with cross-attention, 9 heads of 1088) priced on an
    A100 40GB for seed 000's micro-batch of 3 x 30 s."""
    import os
    import subprocess
    import sys

    from voxrelay.models.parler.config import KNOWN_T5
    from voxrelay.models.parler.export import upstream_config
    from voxrelay.models.parler.modeling import ParlerConfig, ParlerDecoderConfig

    folder = tmp_path / "parler-tts-untrained-600M"
    folder.mkdir()
    config = ParlerConfig(KNOWN_T5["google/flan-t5-base"], ParlerDecoderConfig(), 32128)
    (folder / "config.json").write_text(json.dumps(upstream_config(config)))
    example = Path(__file__).parents[3] / "examples" / "parler-mini-v0.1.yaml"
    res = subprocess.run([sys.executable, "-m", "voxrelay", "plan", str(example), f"model.init_from={folder}",
                          f"root={tmp_path / 'root'}", "--gpu", "a100-40gb", "--seq-len", "8000", "--json"],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    full = next(r for r in rows if r["strategy"] == "ddp" and not r["lora"] and not r["gradient_checkpointing"]
                and r["optimizer"] == "adamw")
    # fp32 weights of T5-base 109.6M + decoder 422.9M + prompts 32.9M + projection 0.8M; the T5 frozen: no grads
    assert 0.56e9 * 4 < full["per_gpu_bytes"]["weights"] < 0.57e9 * 4
    assert 0.45e9 * 4 < full["per_gpu_bytes"]["grads"] < 0.46e9 * 4
    assert full["fits"] and 15e9 < full["per_gpu_bytes"]["total"] < 40e9
    assert full["per_gpu_bytes"]["logits"] == 12 * 9 * 1088 * 8000  # nine heads of 1,088 at the backward peak


def test_lora_adapts_the_decoders_attention_and_mlp_only(parts):
    """For small GPUs (upstream users hit OOM with the frozen T5): LoRA on the decoder's self- and
    cross-attention and MLP; the T5, the embeddings and the heads stay as built."""
    from voxrelay.models.lora_config import LoraConfig
    from voxrelay.train.strategies import apply_lora, trainable_state

    model = _build(parts, "model.dropout=0")
    before = {k: v.clone() for k, v in model.module.state_dict().items()}
    torch.manual_seed(0)
    apply_lora(model, LoraConfig())
    trained = trainable_state(model.module)
    assert trained and all(".lora_" in k and ".decoder.model.decoder.layers." in k for k in trained)
    assert any("encoder_attn" in k for k in trained) and any(".fc1." in k for k in trained)
    with torch.no_grad():  # B starts at 0: give the adapters an effect, as after a few steps
        for k, v in trained.items():
            if "lora_B" in k:
                v.normal_(0, 0.1)
    batch = model.collate([model.example(r) for r in _rows()])
    pop_counts(batch)
    terms = model.loss(model.module, batch)
    sum(t.weight * t.sum / t.count for t in terms.values()).backward()
    assert all(p.grad is not None for p in trained.values())
    merged = model.module.merge_and_unload()
    after = merged.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items() if k.startswith("text_encoder."))
    assert not torch.equal(after["decoder.model.decoder.layers.0.fc1.weight"],
                           before["decoder.model.decoder.layers.0.fc1.weight"])


# differences from upstream's own files that an export keeps on purpose (each with its reason)
GENERATION_DIFFERENT = {
    "_from_model_config": "ours is written for generation, not derived: with true, upstream's generate rebuilds it "
                          "from config.json and drops do_sample/max_length",
    "transformers_version": "the version that wrote the file; ours is not written by transformers",
}
GENERATION_EXTRA = {"do_sample", "max_length"}  # released checkpoints carry them (sampling, 30 s at 86 frames/s)
CONFIG_DIFFERENT = {
    "decoder.add_cross_attention": "true as upstream's from_sub_models_pretrained (the init scripts) sets it",
    "decoder.is_decoder": "the same",
    "decoder.architectures": "as a released decoder config names it",
}


def _differences(ours: dict, theirs: dict, prefix: str = "") -> list[str]:
    """Dotted keys present in both whose values differ (recursing into sub-configs)."""
    out = []
    for key in sorted(set(ours) & set(theirs)):
        if isinstance(ours[key], dict) and isinstance(theirs[key], dict):
            out += _differences(ours[key], theirs[key], f"{prefix}{key}.")
        elif ours[key] != theirs[key]:
            out.append(f"{prefix}{key}")
    return out


def test_export_in_upstreams_format_matches_upstreams_own_files_field_by_field(parts, tmp_path):
    """generation_config.json and config.json of a `--format parler` export against the ones upstream's
    save_pretrained wrote for the same model: upstream's README inference (`model.generate(input_ids=…,
    prompt_input_ids=…)`) needs bos_token_id; `scripts/parler_live_checks.py` runs that generate live."""
    from voxrelay.inference import export

    model = _build(parts, f"model.init_from={FIXTURE}", f"model.description_tokenizer={parts['prompt_tokenizer']}")
    export(model, _dac(parts), tmp_path / "up", fmt="parler")
    ours = json.loads((tmp_path / "up" / "generation_config.json").read_text())
    theirs = json.loads((FIXTURE / "generation_config.json").read_text())
    assert [k for k in theirs if k not in GENERATION_DIFFERENT and ours.get(k, "absent") != theirs[k]] == []
    assert set(ours) - set(theirs) == GENERATION_EXTRA and ours["max_length"] == 30 * 86
    config = json.loads((tmp_path / "up" / "config.json").read_text())
    upstream = json.loads((FIXTURE / "config.json").read_text())
    del config["audio_encoder"], upstream["audio_encoder"]  # this test's DAC is a tiny one: test_parler_export_dac.py
    assert [k for k in _differences(config, upstream) if k not in CONFIG_DIFFERENT] == []


def test_adapter_only_export_is_peft_on_upstreams_module_names(parts, tmp_path):
    """`export --adapter-only` of a Parler LoRA run: peft's files, whose target modules, keys and base name
    are upstream's (`PeftModel.from_pretrained(ParlerTTSForConditionalGeneration…)` loads it: checked live by
    `scripts/parler_live_checks.py`, recorded in the fixture README), and voxrelay reads it back."""
    import re

    from safetensors import safe_open

    from voxrelay.inference import export, load_from_export
    from voxrelay.models.lora_config import LoraConfig
    from voxrelay.train.strategies import apply_lora, base_hash, describe_base

    extra = (f"model.init_from={FIXTURE}", f"model.description_tokenizer={parts['prompt_tokenizer']}")
    model = _build(parts, *extra)
    cfg = _cfg(parts, *extra)
    note = {"base": describe_base(cfg, 0), "base_hash": base_hash(model.module), "seed": 0,
            "model": cfg.model_dump(mode="json"), "data": DataSpec(9, 1024).to_note()}
    torch.manual_seed(0)
    apply_lora(model, LoraConfig())
    with torch.no_grad():  # adapters that change the output, as after training
        for name, p in model.module.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    assert (_fixture_logits(model) - load_file(str(FIXTURE / "io.safetensors"))["logits"]).abs().max() > 1e-2
    export(model, _dac(parts), tmp_path / "ad", note, adapter_only=True)
    adapter = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(FIXTURE) and adapter["peft_type"] == "LORA"
    assert adapter["auto_mapping"] == {"base_model_class": "ParlerTTSForConditionalGeneration",
                                       "parent_library": "parler_tts.modeling_parler_tts"}
    old_peft = json.loads((FIXTURE / "peft_0.13.2_lora_config_fields.json").read_text())["fields"]
    assert set(adapter) <= set(old_peft)  # peft 0.13 (upstream's time) refuses any key it does not know
    upstream_keys = list(load_file(str(FIXTURE / "model.safetensors"))) + list(
        json.loads((FIXTURE / "audio_encoder_keys.json").read_text()))
    linear = {k.removesuffix(".weight") for k in upstream_keys if k.endswith(".weight")}
    targets = sorted(m for m in {k.rsplit(".", 1)[0] for k in upstream_keys}
                     if re.fullmatch(adapter["target_modules"], m))
    assert len(targets) == 2 * 10 and set(targets) <= linear  # 2 layers x (self 4 + cross 4 + fc1 + fc2)
    with safe_open(str(tmp_path / "ad" / "adapter_model.safetensors"), "pt") as f:
        saved = set(f.keys())
    assert saved == {f"base_model.model.{m}.lora_{ab}.weight" for m in targets for ab in "AB"}
    assert not (tmp_path / "ad" / "model.safetensors").exists()
    back, _ = load_from_export(str(tmp_path / "ad"))
    assert torch.equal(_fixture_logits(back), _fixture_logits(model))


def _fixture_logits(model) -> torch.Tensor:
    """Audio logits of the upstream fixture's inputs (ids within the fixture model's vocabularies)."""
    from voxrelay.models.parler import delay

    module = model.module.get_base_model() if hasattr(model.module, "get_base_model") else model.module
    io = load_file(str(FIXTURE / "io.safetensors"))
    module.eval()
    with torch.no_grad():
        cond = module.encode(io["input_ids"], io["attention_mask"], io["prompt_input_ids"], io["prompt_attention_mask"])
        return module.decode(delay.decoder_inputs(io["labels"]), cond)
