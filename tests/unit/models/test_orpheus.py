"""The orpheus family against upstream Orpheus-TTS' layout, with a tiny random Llama of Orpheus' vocabulary,
a Llama-3-style tokenizer built the same way as the real one, and a tiny random SNAC."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, LlamaForCausalLM

from tests.helpers.orpheus import save_llama3_tokenizer, save_tiny_llama, save_tiny_snac
from voxrelay.config import ConfigError
from voxrelay.models.base import LOSS_COUNT, DataSpec
from voxrelay.models.hf import ModelLoadError
from voxrelay.models.orpheus import layout as L
from voxrelay.models.orpheus.config import OrpheusConfig
from voxrelay.models.registry import build_model, load_model

DATA = DataSpec(7, 4096, ["tara", "leo"], 11.71875, 24000)
TINY = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, max_seq_len=512)


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    d = tmp_path_factory.mktemp("orpheus")
    tok = save_llama3_tokenizer(d / "llama3-tokenizer")
    return SimpleNamespace(tokenizer=tok, orpheus=save_tiny_llama(d / "orpheus", tok),
                           llama=save_tiny_llama(d / "llama3", tok, orpheus=False), snac=save_tiny_snac(d / "snac"))


@pytest.fixture(scope="module")
def model(parts: SimpleNamespace):
    return build_model(OrpheusConfig(init_from=str(parts.orpheus), max_seq_len=512), DATA, 0)


def row(codes: np.ndarray, text: str = "hello there", speaker: str | None = "tara") -> SimpleNamespace:
    return SimpleNamespace(text=text, speaker=speaker, description=None, codes=codes)


def grid(frames: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 4096, size=(7, frames))


def test_frame_order_and_offsets_are_upstreams() -> None:
    c0, c1, c2 = [5], [10, 11], [20, 21, 22, 23]  # one coarse frame of SNAC's three codebooks
    codes = np.array([c0 + c1 + c2]).T  # our grid rows: c0, c1 sub 0..1, c2 sub 0..3
    expect = [c0[0], c1[0], c2[0], c2[1], c1[1], c2[2], c2[3]]  # c0[i], c1[2i], c2[4i], c2[4i+1], c1[2i+1], ...
    assert L.codes_to_ids(codes).tolist() == [128266 + k * 4096 + c for k, c in enumerate(expect)]
    assert (L.NUM_CUSTOM_TOKENS, L.TOKENIZER_SIZE, L.VOCAB_SIZE) == (28683, 156939, 156940)
    assert (L.START_OF_HUMAN, L.END_OF_HUMAN, L.START_OF_AI, L.START_OF_SPEECH, L.END_OF_SPEECH, L.END_OF_AI,
            L.PAD) == (128259, 128260, 128261, 128257, 128258, 128262, 128263)


def test_decode_of_encode_round_trips_and_drops_what_upstream_drops() -> None:
    codes = grid(9)
    ids = L.codes_to_ids(codes)
    assert np.array_equal(L.ids_to_codes(L.prompt_ids([1, 2]) + ids.tolist() + [L.END_OF_SPEECH, L.END_OF_AI]), codes)
    noisy = [L.START_OF_SPEECH, *ids[:7].tolist(), L.START_OF_SPEECH, *ids.tolist(), *ids[:3].tolist()]
    assert np.array_equal(L.ids_to_codes(noisy), codes)  # cropped after the LAST start_of_speech; partial frame cut
    bad = ids.copy()
    bad[7 + 1] = int(L.OFFSETS[0]) + 5  # position 1 of frame 1 holds a position-0 id: upstream rejects the frame
    assert np.array_equal(L.ids_to_codes(bad), np.delete(codes, 1, axis=1))


def test_a_frame_repeating_the_previous_frames_first_code_is_dropped_as_upstream(parts: SimpleNamespace) -> None:
    """Upstream's preparation (Unsloth notebook, remove_duplicate_frames) over the flat ids: keep frame 0, then a
    frame only if its first id differs from the last KEPT frame's first id. Written out by hand for 7 frames."""
    c0 = [5, 5, 9, 9, 9, 5, 7]  # frames 1, 3 and 4 repeat the c0 before them; frame 5's 5 differs from 9: kept
    codes = np.stack([c0] + [[10 * f + r for f in range(7)] for r in range(1, 7)])  # rows 1-6 all distinct
    assert L.drop_duplicate_frames(codes).tolist() == codes[:, [0, 2, 5, 6]].tolist()
    ids = L.codes_to_ids(codes).tolist()
    upstream = ids[:7]  # the notebook's loop, literally: compare with result[-7], the last kept frame's first id
    for i in range(7, len(ids), 7):
        if ids[i] != upstream[-7]:
            upstream += ids[i:i + 7]
    assert L.codes_to_ids(L.drop_duplicate_frames(codes)).tolist() == upstream
    assert L.drop_duplicate_frames(codes[:, :1]).tolist() == codes[:, :1].tolist()  # one frame, and none
    assert L.drop_duplicate_frames(codes[:, :0]).shape == (7, 0)
    on = build_model(OrpheusConfig(init_from=str(parts.orpheus)), DATA, 0)  # the default: as upstream
    off = build_model(OrpheusConfig(init_from=str(parts.orpheus), drop_duplicate_frames=False), DATA, 0)
    prompt = len(on.prompt_ids("hello there", "tara"))
    assert on.example(row(codes))["input_ids"][prompt:-2].tolist() == upstream
    assert off.example(row(codes))["input_ids"][prompt:-2].tolist() == ids
    assert on.length(row(codes)) == off.length(row(codes)) == prompt + 7 * 7 + 2  # planned before: a bound


def test_an_orpheus_run_saved_before_duplicate_frames_were_dropped_resumes_only_as_it_trained() -> None:
    from voxrelay.config import config_changes, load_config

    new = load_config(None, ["model.family=orpheus"]).to_dict()
    old = {**new, "model": {k: v for k, v in new["model"].items() if k != "drop_duplicate_frames"}}
    assert config_changes(old, new)[1] == ["model.drop_duplicate_frames"]  # it trained without: refused
    kept = load_config(None, ["model.family=orpheus", "model.drop_duplicate_frames=false"]).to_dict()
    assert config_changes(old, kept) == ([], [])


def test_snac_codes_round_trip_through_orpheus_ids(parts: SimpleNamespace) -> None:
    from voxrelay.codecs.snac import SnacCodec

    codec = SnacCodec.from_pretrained(str(parts.snac))
    wav = (0.1 * np.sin(np.arange(30000) * 0.05)).astype(np.float32)
    codes = codec.encode(wav)
    assert codes.shape[0] == 7 and codec.codebook_size == 4096
    back = L.ids_to_codes(L.codes_to_ids(codes))
    assert np.array_equal(back, codes)
    assert np.array_equal(codec.decode(back), codec.decode(codes))


def test_training_sequence_is_upstreams(model, parts: SimpleNamespace) -> None:
    tok = AutoTokenizer.from_pretrained(str(parts.tokenizer))
    text = "well <laugh> that was <sigh> something"
    codes = grid(4)
    ex = model.example(row(codes, text, "tara"))
    text_ids = tok(f"tara: {text}").input_ids  # add_special_tokens=True puts BOS 128000 first, as upstream
    assert text_ids[0] == 128000
    expect = [128259, *text_ids, 128009, 128260, 128261, 128257, *L.codes_to_ids(codes).tolist(), 128258, 128262]
    assert ex["input_ids"].tolist() == expect
    assert ex["labels"].tolist() == expect  # loss_on=all: labels = input_ids (upstream)
    assert model.length(row(codes, text, "tara")) == len(expect)
    assert model.prompt_ids(text, None)[1:-4] == tok(text).input_ids  # single speaker: the bare text
    with pytest.raises(ValueError, match="unknown voice 'zac'"):
        model.prompt_ids(text, "zac")


def test_loss_on_speech_labels_only_the_speech(parts: SimpleNamespace) -> None:
    m = build_model(OrpheusConfig(init_from=str(parts.orpheus), loss_on="speech"), DATA, 0)
    ex = m.example(row(grid(3)))
    labelled = ex["input_ids"][ex["labels"] != -100]
    assert labelled.tolist() == [*L.codes_to_ids(grid(3)).tolist(), 128258, 128262]


def test_padded_batch_loss_is_the_sum_of_single_example_losses(model) -> None:
    examples = [model.example(row(grid(2, 1), "hi")), model.example(row(grid(6, 2), "a longer text here", "leo"))]
    batch = model.collate(examples)
    assert batch["input_ids"].shape == (2, len(examples[1]["input_ids"]))
    n0 = len(examples[0]["input_ids"])
    assert (batch["input_ids"][0, n0:] == L.PAD).all() and batch["attention_mask"][0, n0:].sum() == 0
    assert (batch["labels"][0, n0:] == -100).all()
    model.module.eval()
    together = model.loss(model.module, batch)
    alone = [model.loss(model.module, model.collate([e])) for e in examples]
    assert int(together["ce"].count) == int(batch[LOSS_COUNT + "ce"]) == sum(int(a["ce"].count) for a in alone)
    assert float(together["ce"].sum) == pytest.approx(sum(float(a["ce"].sum) for a in alone), rel=1e-5)
    single = model.collate([examples[0]])
    logits = model.module(input_ids=single["input_ids"]).logits[0, :-1]
    expect = F.cross_entropy(logits.float(), single["input_ids"][0, 1:], reduction="sum")
    assert float(alone[0]["ce"].sum) == pytest.approx(float(expect), rel=1e-5)


def test_init_from_orpheus_keeps_its_audio_rows_and_plain_llama3_gets_them_added(parts: SimpleNamespace) -> None:
    source = LlamaForCausalLM.from_pretrained(str(parts.orpheus))
    kept = build_model(OrpheusConfig(init_from=str(parts.orpheus)), DATA, 0)
    assert torch.equal(kept.module.get_input_embeddings().weight, source.get_input_embeddings().weight)
    plain = LlamaForCausalLM.from_pretrained(str(parts.llama))
    grown = build_model(OrpheusConfig(init_from=str(parts.llama)), DATA, 0)
    emb = grown.module.get_input_embeddings().weight
    assert emb.shape == (L.VOCAB_SIZE, 32) and torch.equal(emb[: L.LLAMA3_VOCAB], plain.get_input_embeddings().weight)
    assert grown.module.lm_head.weight.data_ptr() == emb.data_ptr()  # still tied
    assert len(grown.tokenizer) == L.TOKENIZER_SIZE
    assert grown.tokenizer.convert_tokens_to_ids("<custom_token_10>") == L.AUDIO_START


def test_generate_is_seeded_and_decodable(model) -> None:
    a = model.generate("hello", "tara", max_frames=4, temperature=1.0, seed=3)
    b = model.generate("hello", "tara", max_frames=4, temperature=1.0, seed=3)
    assert a.shape[0] == 7 and 1 <= a.shape[1] <= 4 and np.array_equal(a, b)
    assert a.min() >= 0 and a.max() < 4096


def test_export_loads_with_plain_transformers_and_maps_the_special_tokens(model, tmp_path: Path) -> None:
    model.save_pretrained(tmp_path / "out")
    lm = LlamaForCausalLM.from_pretrained(str(tmp_path / "out"))
    assert torch.equal(lm.get_input_embeddings().weight, model.module.get_input_embeddings().weight)
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    ids = {"<|begin_of_text|>": 128000, "<|eot_id|>": 128009}
    ids.update({f"<custom_token_{i - 128256}>": i for i in (128257, 128258, 128259, 128260, 128261, 128262, 128263)})
    assert {t: tok.convert_tokens_to_ids(t) for t in ids} == ids and tok.pad_token_id == 128263
    assert lm.generation_config.eos_token_id == 128258
    again = load_model(tmp_path / "out")
    assert again.family == "orpheus" and again.speakers == ["tara", "leo"]
    greedy = [m.generate("hi", "leo", max_frames=3, temperature=0) for m in (model, again)]
    assert np.array_equal(*greedy)


def test_meta_build_has_the_shapes_of_the_real_one(parts: SimpleNamespace) -> None:
    cfg = OrpheusConfig(tokenizer=str(parts.tokenizer), **TINY)
    real, meta = build_model(cfg, DATA, 0), build_model(cfg, DATA, 0, meta=True)
    assert all(p.device.type == "meta" for p in meta.module.parameters())
    assert {k: v.shape for k, v in meta.module.state_dict().items()} == \
        {k: v.shape for k, v in real.module.state_dict().items()}
    assert real.module.config.tie_word_embeddings and real.module.config.vocab_size == L.VOCAB_SIZE


def test_bad_setups_are_user_errors(parts: SimpleNamespace, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs SNAC codes"):
        build_model(OrpheusConfig(init_from=str(parts.orpheus)), DataSpec(4, 256), 0)
    with pytest.raises(ConfigError, match="model.init_from .* or, for a random init, model.tokenizer"):
        build_model(OrpheusConfig(), DATA, 0)
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, "<unk>")))
    other.save_pretrained(str(tmp_path / "other"))
    with pytest.raises(ModelLoadError, match="neither Llama-3's"):
        build_model(OrpheusConfig(tokenizer=str(tmp_path / "other"), **TINY), DATA, 0)
    with pytest.raises(ModelLoadError, match="no such folder"):
        build_model(OrpheusConfig(init_from=str(tmp_path / "missing")), DATA, 0)
