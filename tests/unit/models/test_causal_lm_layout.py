"""The ``causal_lm`` family: layouts declared in YAML, checked against upstream ids; the orpheus layout built through
causal_lm's own loading (tokenizer extension, module, ids) against the ``orpheus`` family's (same examples, batches,
loss and generation, bit for bit; that family's outputs before it became a layout: test_orpheus_golden.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from tests.helpers.orpheus import save_llama3_tokenizer, save_tiny_llama
from voxrelay.errors import ConfigError
from voxrelay.models.base import LOSS_COUNT, DataSpec
from voxrelay.models.causal_lm.config import CausalLMConfig
from voxrelay.models.causal_lm.layout import BUILT_IN, load_layout
from voxrelay.models.causal_lm.loading import load_tokenizer
from voxrelay.models.causal_lm.tokens import drop_repeated_frames
from voxrelay.models.hf import ModelLoadError
from voxrelay.models.orpheus import layout as OL
from voxrelay.models.orpheus.config import OrpheusConfig
from voxrelay.models.registry import build_model, load_model

ORPHEUS_DATA = DataSpec(7, 4096, ["tara", "leo"], 11.71875, 24000)


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("causal_lm")
    tok = save_llama3_tokenizer(d / "llama3-tokenizer")
    return SimpleNamespace(dir=d, tokenizer=tok, orpheus=save_tiny_llama(d / "orpheus", tok))


def row(codes: np.ndarray, text: str = "hello there", speaker: str | None = "tara") -> SimpleNamespace:
    return SimpleNamespace(text=text, speaker=speaker, description=None, codes=codes, duration=1.0)


def test_every_built_in_layout_loads_and_names_its_upstream() -> None:
    for path in sorted(BUILT_IN.glob("*.yaml")):
        lay = load_layout(path.stem)
        assert lay.name == path.stem and lay.upstream, path
        assert len(set(lay.added_names())) == len(lay.added_names())


def test_the_orpheus_layout_pins_the_orpheus_familys_ids() -> None:
    lay = load_layout("orpheus")
    assert lay.ids["<custom_token_10>"] == OL.AUDIO_START and lay.vocab_size == OL.VOCAB_SIZE
    assert lay.rows == list(OL.FRAME_ROWS) and len(lay.added_names()) == OL.NUM_CUSTOM_TOKENS
    codes = np.random.default_rng(0).integers(0, 4096, (7, 9))
    codes[0, 3] = codes[0, 2]
    assert np.array_equal(drop_repeated_frames(codes), OL.drop_duplicate_frames(codes))


def test_llasa_tokens_added_to_a_llama3_tokenizer_get_upstreams_ids(parts: SimpleNamespace) -> None:
    """RECIPES/upstream train_tts.py: 8 markers then <|s_0|>..<|s_65535|> after Llama-3's 128,256 ids:
    TU_START 128258, SG_START 128260, SG_END 128261, <|s_k|> = 128264 + k (vocabulary 193,800)."""
    tok = load_tokenizer(str(parts.tokenizer), "model.tokenizer", load_layout("llasa"))
    assert len(tok) == 193_800
    assert tok.convert_tokens_to_ids(["<|TEXT_UNDERSTANDING_START|>", "<|SPEECH_GENERATION_START|>",
                                      "<|SPEECH_GENERATION_END|>", "<|s_0|>", "<|s_65535|>"]) == \
        [128258, 128260, 128261, 128264, 193799]


@pytest.fixture(scope="module")
def twins(parts: SimpleNamespace) -> SimpleNamespace:
    """The orpheus family and causal_lm with the orpheus layout, on the same checkpoint."""
    family = build_model(OrpheusConfig(init_from=str(parts.orpheus), max_seq_len=512), ORPHEUS_DATA, 0)
    layout = build_model(CausalLMConfig(layout="orpheus", init_from=str(parts.orpheus), max_seq_len=512),
                         ORPHEUS_DATA, 0)
    return SimpleNamespace(family=family, layout=layout)


@pytest.mark.parametrize("loss_on", ["all", "speech"])
def test_the_orpheus_layout_trains_on_the_orpheus_familys_examples_and_loss(twins, loss_on: str) -> None:
    twins.family.loss_on = twins.layout.loss_on = loss_on
    rng = np.random.default_rng(1)
    rows = [row(rng.integers(0, 4096, (7, n)), text=t, speaker=s)
            for n, t, s in [(5, "hello there", "tara"), (9, "<laugh> well, ok", "leo"), (3, "the dog", None)]]
    for r in rows:
        a, b = twins.family.example(r), twins.layout.example(r)
        assert all(np.array_equal(a[k], b[k]) for k in ("input_ids", "labels"))
        assert twins.family.length(r) == twins.layout.length(r)
    for collate in ("collate", "collate_packed"):
        a = getattr(twins.family, collate)([twins.family.example(r) for r in rows])
        b = getattr(twins.layout, collate)([twins.layout.example(r) for r in rows])
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    batch = twins.layout.collate([twins.layout.example(r) for r in rows])
    batch = {k: v for k, v in batch.items() if not k.startswith(LOSS_COUNT)}
    la, lb = twins.family.loss(twins.family.module, batch), twins.layout.loss(twins.layout.module, batch)
    assert la.keys() == lb.keys() and all(torch.equal(la[k].sum, lb[k].sum) for k in la)


def test_the_orpheus_layout_generates_what_the_orpheus_family_does(twins) -> None:
    for options in ({}, {"top_p": 0.5, "repetition_penalty": 1.3}, {"temperature": 0.0}):
        a = twins.family.generate("hello there", "tara", max_frames=4, seed=3, **options)
        b = twins.layout.generate("hello there", "tara", max_frames=4, seed=3, **options)
        assert a.shape == (7, 4) and np.array_equal(a, b), options


def test_a_saved_layout_model_loads_with_transformers_and_without_its_layout_file(parts, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = yaml.safe_load((BUILT_IN / "orpheus.yaml").read_text()) | {"name": "mine"}
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(spec))
    model = build_model(CausalLMConfig(layout=str(mine), init_from=str(parts.orpheus), max_seq_len=256),
                        ORPHEUS_DATA, 0)
    model.save_pretrained(tmp_path / "out")
    mine.unlink()
    again = load_model(tmp_path / "out")
    assert again.layout.name == "mine" and again.ids == model.ids
    assert np.array_equal(again.generate("hi", "tara", max_frames=2, seed=1),
                          model.generate("hi", "tara", max_frames=2, seed=1))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert hf.generation_config.eos_token_id == OL.END_OF_SPEECH and tok.convert_tokens_to_ids("<custom_token_10>") \
        == OL.AUDIO_START


def test_bad_layouts_and_setups_are_refused_naming_the_field(parts, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither a built-in layout"):
        CausalLMConfig(layout=str(tmp_path / "nope.yaml"))
    bad = yaml.safe_load((BUILT_IN / "llasa.yaml").read_text())
    bad["prompt"] = "{text}"
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match="exactly one of prompt"):
        CausalLMConfig(layout=str(tmp_path / "two.yaml"))
    bad = yaml.safe_load((BUILT_IN / "llasa.yaml").read_text()) | {"codebooks": "seven"}
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match="codebooks"):
        CausalLMConfig(layout=str(tmp_path / "typo.yaml"))
    with pytest.raises(ConfigError, match="needs codes of 1 x 65536"):
        build_model(CausalLMConfig(layout="llasa", tokenizer=str(parts.tokenizer)), ORPHEUS_DATA, 0)
    wrong = yaml.safe_load((BUILT_IN / "llasa.yaml").read_text())
    wrong["ids"]["<|s_0|>"] = 128265
    (tmp_path / "wrong.yaml").write_text(yaml.safe_dump(wrong))
    with pytest.raises(ModelLoadError, match="<|s_0|> is 128264"):
        load_tokenizer(str(parts.tokenizer), "model.tokenizer", load_layout(str(tmp_path / "wrong.yaml")))


def test_the_orpheus_layout_file_resolves_to_upstreams_ids_written_out(twins) -> None:
    """orpheus.yaml, resolved against a Llama-3 tokenizer, against Orpheus' ids as upstream's code writes them."""
    got, want = twins.layout.ids, OL.token_map()
    assert (got.before_text, got.after_text, got.after_audio, got.stop, got.pad, got.bos, got.audio_start) == \
        (want.before_text, want.after_text, want.after_audio, want.stop, want.pad, want.bos, want.audio_start)


def upstream_llasa_example(tok, text: str, speech: list[int]) -> tuple[list[int], list[int]]:
    """LLaSA_training train_tts.py's TTSDataset.__getitem__, transcribed: the chat with placeholder markers,
    tokenized by the chat template, the markers replaced by the text and speech sequences; labels from
    SPEECH_GENERATION_START on, pad (= <|eot_id|>) positions masked."""
    tu, sg = tok.convert_tokens_to_ids(["<|TEXT_UNDERSTANDING_START|>", "<|SPEECH_GENERATION_START|>"])
    tu_end, sg_end = tok.convert_tokens_to_ids(["<|TEXT_UNDERSTANDING_END|>", "<|SPEECH_GENERATION_END|>"])
    chat = [{"role": "user", "content": "Convert the text to speech:<|TEXT_UNDERSTANDING_START|>"},
            {"role": "assistant", "content": "<|SPEECH_GENERATION_START|>"}]
    # transformers 4 (upstream's) returned the ids; 5 returns a dict unless return_dict=False
    ids = list(tok.apply_chat_template(chat, tokenize=True, return_dict=False, date_string="26 Jul 2024"))
    text_seq = [tu, *tok.encode(text, add_special_tokens=False), tu_end]
    i = ids.index(tu)
    ids = ids[:i] + text_seq + ids[i + 1:]
    i = ids.index(sg)
    ids = ids[:i] + [sg, *speech, sg_end] + ids[i + 1:]
    labels = [-100] * len(ids)
    start = ids.index(sg)
    labels[start:] = ids[start:]
    labels = [-100 if t == tok.convert_tokens_to_ids("<|eot_id|>") else lab for t, lab in zip(ids, labels, strict=True)]
    return ids, labels


def test_llasa_examples_are_upstreams_sequence_and_labels(tmp_path: Path) -> None:
    from tests.helpers.orpheus import save_llama32_instruct_tokenizer

    tok_dir = save_llama32_instruct_tokenizer(tmp_path / "llama32")
    model = build_model(CausalLMConfig(layout="llasa", tokenizer=str(tok_dir), hidden_size=32, num_layers=1,
                                       num_heads=2, num_kv_heads=1, intermediate_size=64),
                        DataSpec(1, 65536, [], 50.0, 16000), 0)
    codes = np.random.default_rng(0).integers(0, 65536, (1, 12))
    got = model.example(row(codes, text="The quick brown fox.", speaker=None))
    ids, labels = upstream_llasa_example(model.tokenizer, "The quick brown fox.", (codes[0] + 128264).tolist())
    # upstream's sequence ends with the assistant turn's <|eot_id|>: never a target (pad = eot), and as the last
    # input it predicts nothing, so leaving it out changes no loss term
    assert ids[-1] == 128009 and labels[-1] == -100
    assert got["input_ids"].tolist() == ids[:-1] and got["labels"].tolist() == labels[:-1]
    # the prompt synthesis starts from is the training prefix (through SPEECH_GENERATION_START)
    assert model.prompt_ids("The quick brown fox.") == ids[: ids.index(128260) + 1]
    assert "Today Date: 26 Jul 2024" in model.tokenizer.decode(got["input_ids"])


def upstream_neutts_prompt(tok, phones: str) -> list[int]:
    """neuttsair/neutts.py NeuTTSAir._apply_chat_template, transcribed, with ``phones`` as its input text (upstream
    prepends a reference's phonemes and appends its codes: this layout has no reference)."""
    speech_replace, speech_gen_start, text_replace, text_prompt_start, text_prompt_end = tok.convert_tokens_to_ids(
        ["<|SPEECH_REPLACE|>", "<|SPEECH_GENERATION_START|>", "<|TEXT_REPLACE|>", "<|TEXT_PROMPT_START|>",
         "<|TEXT_PROMPT_END|>"])
    input_ids = tok.encode(phones, add_special_tokens=False)
    ids = tok.encode("user: Convert the text to speech:<|TEXT_REPLACE|>\nassistant:<|SPEECH_REPLACE|>")
    i = ids.index(text_replace)
    ids = ids[:i] + [text_prompt_start] + input_ids + [text_prompt_end] + ids[i + 1:]
    i = ids.index(speech_replace)
    return ids[:i] + [speech_gen_start]


def test_neutts_prompts_phonemes_as_upstreams_inference_and_labels_as_its_finetune(tmp_path: Path) -> None:
    pytest.importorskip("phonemizer")
    from phonemizer.backend import EspeakBackend

    from tests.helpers.qwen import save_qwen2_tokenizer

    model = build_model(CausalLMConfig(layout="neutts", tokenizer=str(save_qwen2_tokenizer(tmp_path / "qwen")),
                                       hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                       intermediate_size=64), DataSpec(1, 65536, [], 50.0, 16000), 0)
    assert type(model.module).__name__ == "Qwen2ForCausalLM" and model.ids.pad == 151643
    text = "Did Felix carry it? Hello, world."
    import espeakng_loader
    from phonemizer.backend.espeak.wrapper import EspeakWrapper

    EspeakWrapper.set_library(espeakng_loader.get_library_path())  # as upstream's _configure_espeak_library does
    EspeakWrapper.set_data_path(espeakng_loader.get_data_path())
    g2p = EspeakBackend(language="en-us", preserve_punctuation=True, with_stress=True)  # upstream's _to_phones
    phones = " ".join(g2p.phonemize([text])[0].split())
    assert phones.startswith("dˈɪd fˈiːlɪks") and phones.endswith("wˈɜːld.")
    assert model.prompt_ids(text) == upstream_neutts_prompt(model.tokenizer, phones)
    codes = np.random.default_rng(0).integers(0, 65536, (1, 7))
    got = model.example(row(codes, text=text, speaker=None))
    sg = model.tokenizer.convert_tokens_to_ids("<|SPEECH_GENERATION_START|>")
    start = got["input_ids"].tolist().index(sg)
    # examples/finetune.py: labels from SPEECH_GENERATION_START on; the speech is <|speech_k|> by name
    assert (got["labels"][:start] == -100).all() and np.array_equal(got["labels"][start:], got["input_ids"][start:])
    speech = model.tokenizer.convert_ids_to_tokens(got["input_ids"][start + 1:-1].tolist())
    assert speech == [f"<|speech_{c}|>" for c in codes[0]]


POLISH = ["Zażółć gęślą jaźń.", "Łódź jest piękna.", "Dzień dobry, miło cię widzieć."]


def test_text_coverage_lists_what_the_tokenizer_splits_and_add_tokens_gives_them_tokens(parts) -> None:
    """A new language on a byte-level BPE: 'ź' is two byte tokens and can become one; 'ł' spells a symbol of the
    byte alphabet (U+0142 stands for a byte), so as an added token it would read as that byte: refused."""
    cfg = CausalLMConfig(layout="orpheus", tokenizer=str(parts.tokenizer))
    found = {char: how for char, _, how in cfg.text_coverage(POLISH)}
    assert found["ź"] == "2 tokens" and found["ł"].startswith("2 tokens (cannot be added")
    assert "a" not in found and " " not in found
    cfg = CausalLMConfig(layout="orpheus", tokenizer=str(parts.tokenizer), add_tokens=["ź", "ń"])
    found = {char for char, _, _ in cfg.text_coverage(POLISH)}
    assert "ź" not in found and "ń" not in found and "ł" in found
    model = build_model(cfg.model_copy(update={"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                                               "num_kv_heads": 1, "intermediate_size": 64}), ORPHEUS_DATA, 0)
    assert model.tokenizer.convert_tokens_to_ids(["ź", "ń"]) == [OL.TOKENIZER_SIZE, OL.TOKENIZER_SIZE + 1]
    assert model.module.get_input_embeddings().weight.shape[0] == OL.TOKENIZER_SIZE + 2
    with pytest.raises(ConfigError, match=r"\['ł'\] cannot be added"):
        build_model(cfg.model_copy(update={"add_tokens": ["ł"]}), ORPHEUS_DATA, 0)


def test_new_tokens_of_a_checkpoint_are_its_untrained_rows(parts) -> None:
    """On an Orpheus checkpoint (156,940 rows for 156,939 ids: one spare) the first added token takes the spare row,
    which never trained: the new rows start there."""
    model = build_model(CausalLMConfig(layout="orpheus", init_from=str(parts.orpheus), add_tokens=["ź", "ń"]),
                        ORPHEUS_DATA, 0)
    assert model.new_rows == (OL.TOKENIZER_SIZE, OL.TOKENIZER_SIZE + 2)
    assert model.module.get_input_embeddings().weight.shape[0] == OL.TOKENIZER_SIZE + 2


def test_a_run_keeps_its_layout_and_a_resume_compares_it_field_by_field(parts, tmp_path: Path) -> None:
    """The layout's content goes into the config (model.layout_spec): a saved run needs no layout file, an edit that
    changes the examples is refused on resume naming the field, a moved file or a new summary is not."""
    from voxrelay.cli import demo_config_path
    from voxrelay.config import RunConfig, config_changes, load_config

    spec = yaml.safe_load((BUILT_IN / "orpheus.yaml").read_text()) | {"name": "mine"}
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(spec))
    over = ["model={family: causal_lm, layout: " + str(mine) + ", tokenizer: " + str(parts.tokenizer) + "}",
            "codec.type=snac", "codec.path=x/y"]
    saved = load_config(str(demo_config_path()), over).to_dict()
    mine.unlink()
    again = RunConfig.model_validate(saved)  # the run's folder: no layout file needed
    assert again.model.resolved().name == "mine" and again.model.data_needs().codes == (7, 4096)
    moved = tmp_path / "moved.yaml"
    moved.write_text(yaml.safe_dump(spec | {"summary": "same model, new words"}))
    now = load_config(str(demo_config_path()), [*over[:0], over[0].replace(str(mine), str(moved)), *over[1:]])
    safe, refused = config_changes(saved, now.to_dict())
    assert not refused and "model.layout" in safe and "model.layout_spec.summary" in safe
    moved.write_text(yaml.safe_dump(spec | {"loss_on": "speech"}))
    _, refused = config_changes(saved, load_config(str(demo_config_path()), [over[0].replace(str(mine), str(moved)),
                                                                            *over[1:]]).to_dict())
    assert refused == ["model.layout_spec.loss_on"]


def test_layout_mistakes_that_would_train_garbage_are_refused(parts, tmp_path: Path) -> None:
    base = yaml.safe_load((BUILT_IN / "orpheus.yaml").read_text())
    for change, message in [({"speaker_format": "{speaker}"}, "speaker_format must hold"),
                            ({"audio_token": "<a>"}, "audio_token must hold"),
                            ({"stop_token": "x", "pad": 3}, "stop_token.*pad|pad.*stop_token")]:
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(base | change))
        with pytest.raises(ValueError, match=message):
            CausalLMConfig(layout=str(tmp_path / "bad.yaml"))
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(base | {"vocab_size": 1000}))
    with pytest.raises(ConfigError, match="vocab_size 1000 is smaller than its tokenizer"):
        build_model(CausalLMConfig(layout=str(tmp_path / "small.yaml"), init_from=str(parts.orpheus)),
                    ORPHEUS_DATA, 0)
    snac_data = DataSpec(7, 4096, [], 12.0, 24000, codec={"type": "mel_kmeans"})
    with pytest.raises(ConfigError, match="speaks the snac codec, but the prepared data holds mel_kmeans"):
        build_model(CausalLMConfig(layout="orpheus", init_from=str(parts.orpheus)), snac_data, 0)
