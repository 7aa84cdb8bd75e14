"""codec_lm: id layout, training examples, loss, constrained KV-cached generation, files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from voxrelay.errors import UserError
from voxrelay.models.base import LOSS_COUNT
from voxrelay.models.codec_lm.config import CodecLMConfig
from voxrelay.models.codec_lm.model import IGNORE_INDEX, CodecLM, SequenceTooLongError
from voxrelay.models.codec_lm.vocab import VocabLayout

K, C = 2, 16


def tiny_cfg(**kw) -> CodecLMConfig:
    base = dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_seq_len=256)
    return CodecLMConfig(**{**base, **kw})


def tiny_model(speakers: list[str] | None = None, seed: int = 0, **kw) -> CodecLM:
    return CodecLM.build(tiny_cfg(**kw), num_codebooks=K, codebook_size=C, speakers=speakers or [], seed=seed)


def random_codes(frames: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, C, size=(K, frames), dtype=np.int64)


def assert_saved_setting(folder: Path, key: str, value, **kw) -> None:
    """A model built with ``kw`` records ``key: value`` in voxrelay.json and loads back with it, generating the same."""
    model = tiny_model(seed=4, **kw)
    model.save_pretrained(folder)
    assert json.loads((folder / "voxrelay.json").read_text())[key] == value
    again = CodecLM.from_pretrained(folder)
    assert getattr(again, key) == value
    np.testing.assert_array_equal(model.generate("x y", max_frames=6, temperature=0),
                                  again.generate("x y", max_frames=6, temperature=0))


def test_layout_round_trip_and_ranges() -> None:
    layout = VocabLayout(text_vocab=256, num_codebooks=3, codebook_size=10)
    assert (layout.pad_id, layout.bos_id, layout.audio_start_id, layout.audio_end_id) == (256, 257, 258, 259)
    assert layout.audio_offset == 260 and layout.vocab_size == 290
    codes = np.array([[1, 2], [3, 4], [5, 6]])
    ids = layout.codes_to_ids(codes)
    # frame by frame, each codebook in its own range
    assert ids.tolist() == [261, 273, 285, 262, 274, 286]
    assert layout.ids_to_codes(ids).tolist() == codes.tolist()
    assert layout.codebook_range(2) == (280, 290)
    big = np.random.default_rng(0).integers(0, 10, size=(3, 50))
    np.testing.assert_array_equal(layout.ids_to_codes(layout.codes_to_ids(big)), big)
    assert VocabLayout.from_dict(layout.to_dict()) == layout
    with pytest.raises(ValueError, match="codes must be in"):
        layout.codes_to_ids(np.array([[10], [0], [0]]))
    with pytest.raises(ValueError, match="shape"):
        layout.codes_to_ids(np.zeros((2, 4), dtype=np.int64))


def test_example_labels_mask_only_the_prompt() -> None:
    model = tiny_model()
    codes = random_codes(5)
    ex = model.encode_example("hi", codes)
    lay = model.layout
    ids, labels = ex["input_ids"], ex["labels"]
    assert ids.dtype == np.int64 and labels.dtype == np.int64
    assert ids.tolist()[:4] == [lay.bos_id, ord("h"), ord("i"), lay.audio_start_id]
    assert ids[-1] == lay.audio_end_id
    assert (labels[:4] == IGNORE_INDEX).all()
    np.testing.assert_array_equal(labels[4:], ids[4:])
    np.testing.assert_array_equal(lay.ids_to_codes(ids[4:-1]), codes)
    assert len(ids) == model.sequence_length("hi", 5) == 4 + K * 5 + 1


def test_too_long_names_the_config_key() -> None:
    model = tiny_model(max_seq_len=32)
    with pytest.raises(SequenceTooLongError, match=r"model\.max_seq_len is 32"):
        model.encode_example("hello", random_codes(20))
    assert model.sequence_length("hello", 20) == 7 + 40 + 1  # no error: planners filter with it


def test_collate_pads_right() -> None:
    model = tiny_model()
    a, b = model.encode_example("a", random_codes(2)), model.encode_example("long text", random_codes(6))
    batch = model.collate([a, b])
    n_a, n_b = len(a["input_ids"]), len(b["input_ids"])
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape == (2, n_b)
    assert batch["input_ids"][0, n_a:].eq(model.layout.pad_id).all()
    assert batch["labels"][0, n_a:].eq(IGNORE_INDEX).all()
    assert batch["attention_mask"][0].tolist() == [1] * n_a + [0] * (n_b - n_a)
    assert batch["attention_mask"][1].eq(1).all()
    assert batch["input_ids"][1].tolist() == b["input_ids"].tolist()


def test_loss_equals_manual_sum() -> None:
    model = tiny_model()
    exs = [model.encode_example("ab", random_codes(3, 1)), model.encode_example("abcdef", random_codes(5, 2))]
    batch = model.collate(exs)
    terms = model.loss(model.module, batch)
    loss_sum, n, _ = terms["ce"]
    assert int(n) == (K * 3 + 1) + (K * 5 + 1)  # audio ids + AUDIO_END of each example
    assert int(batch[LOSS_COUNT + "ce"]) == int(n) and set(terms) == {"ce"}  # collate counts what the loss will take
    manual, count = 0.0, 0
    with torch.no_grad():
        for ex in exs:  # unpadded, one by one
            logp = torch.log_softmax(model.module(torch.as_tensor(ex["input_ids"])[None]).logits[0].float(), -1)
            for t in range(1, len(ex["input_ids"])):
                if ex["labels"][t] != IGNORE_INDEX:
                    manual -= float(logp[t - 1, ex["labels"][t]])
                    count += 1
    assert int(n) == count
    assert float(loss_sum.detach()) == pytest.approx(manual, rel=1e-4)
    loss_sum.backward()
    assert model.module.lm_head.weight.grad is not None


def test_generation_constraints_and_determinism() -> None:
    model = tiny_model()
    model.module.train()
    codes = model.generate("hello", max_frames=6, temperature=1.0, seed=3)
    assert model.module.training  # training mode restored
    assert codes.dtype == np.int64 and codes.shape[0] == K and 1 <= codes.shape[1] <= 6
    assert codes.min() >= 0 and codes.max() < C
    np.testing.assert_array_equal(codes, model.generate("hello", max_frames=6, temperature=1.0, seed=3))
    others = [model.generate("hello", max_frames=6, temperature=1.0, seed=s) for s in range(4, 8)]
    assert any(o.shape != codes.shape or (o != codes).any() for o in others)


def test_generation_stops_at_audio_end_on_a_frame_boundary() -> None:
    model = tiny_model()
    bias = torch.zeros(model.layout.vocab_size)
    bias[model.layout.audio_end_id] = 1e4  # the model "wants" to end everywhere
    handle = model.module.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    try:
        codes = model.generate("hello", max_frames=10, seed=0)
    finally:
        handle.remove()
    assert codes.shape == (K, 1)  # END is refused inside a frame and before the first frame


def test_generation_bounded_by_max_seq_len() -> None:
    model = tiny_model(max_seq_len=40)
    bias = torch.zeros(model.layout.vocab_size)
    bias[model.layout.audio_end_id] = -1e4  # never ends by itself
    handle = model.module.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    try:
        codes = model.generate("hi", seed=0)
    finally:
        handle.remove()
    assert codes.shape == (K, (40 - 4 - 1) // K)


def overfit(model: CodecLM, text: str, codes: np.ndarray, steps: int = 100) -> float:
    """Train ``model`` on one example for ``steps`` AdamW steps; the last mean loss."""
    return train_on(model, [(text, codes)], steps)


def train_on(model: CodecLM, pairs: list[tuple[str, np.ndarray]], steps: int) -> float:
    """Train ``model`` on one batch of (text, codes) examples for ``steps`` AdamW steps; the last mean loss."""
    batch = model.collate([model.encode_example(text, codes) for text, codes in pairs])
    opt = torch.optim.AdamW(model.module.parameters(), lr=3e-3)
    model.module.train()
    for _ in range(steps):
        loss_sum, n, _ = model.loss(model.module, batch)["ce"]
        opt.zero_grad()
        (loss_sum / n).backward()
        opt.step()
    return float(loss_sum.detach() / n)


def test_overfits_one_example_and_generation_reproduces_it() -> None:
    torch.manual_seed(0)
    model = tiny_model()
    codes = random_codes(16, seed=7)
    assert overfit(model, "a tiny sentence", codes) < 0.05
    out = model.generate("a tiny sentence", temperature=0, seed=0)
    assert out.shape == codes.shape  # stopped by AUDIO_END, at the trained length
    assert (out == codes).mean() >= 0.9


def test_build_is_seeded_and_leaves_global_rng_alone() -> None:
    state = torch.get_rng_state()
    a, b, c = tiny_model(seed=1), tiny_model(seed=1), tiny_model(seed=2)
    assert torch.equal(torch.get_rng_state(), state)
    wa, wb, wc = (m.module.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.module.config._attn_implementation == "sdpa"
    assert a.layout == VocabLayout(256, K, C) and a.module.config.vocab_size == a.layout.vocab_size


def test_speaker_prefix() -> None:
    model = tiny_model(speakers=["en-us+m3", "en-gb+f3"])
    ex = model.encode_example("hi", random_codes(2), speaker="en-us+m3")
    prompt = ex["input_ids"][1 : 1 + len("en-us+m3: hi")]
    assert bytes(prompt.tolist()).decode() == "en-us+m3: hi"
    with pytest.raises(ValueError, match="unknown speaker 'nobody'"):
        model.encode_example("hi", random_codes(2), speaker="nobody")
    assert model.sequence_length("hi", 2, "en-gb+f3") == len(ex["input_ids"])
    assert model.generate("hi", speaker="en-gb+f3", max_frames=2).shape[0] == K
    # a model without speakers has no speaker conditioning
    plain = tiny_model()
    assert plain.encode_example("hi", random_codes(2), speaker="x")["input_ids"][1:3].tolist() == [104, 105]


def test_save_load_round_trip(tmp_path: Path) -> None:
    model = tiny_model(speakers=["spk"])
    model.save_pretrained(tmp_path / "m")
    files = {p.name for p in (tmp_path / "m").iterdir()}
    assert {"model.safetensors", "config.json", "voxrelay.json", "tokenizer"} <= files
    meta = json.loads((tmp_path / "m" / "voxrelay.json").read_text())
    assert meta["speakers"] == ["spk"] and meta["tokenizer"] == "bytes" and meta["format_version"] == 1

    again = CodecLM.from_pretrained(tmp_path / "m")
    assert again.layout == model.layout and again.speakers == ["spk"] and again.max_seq_len == 256
    batch = model.collate([model.encode_example("hello", random_codes(4), speaker="spk")])
    with torch.no_grad():
        l1 = model.module(input_ids=batch["input_ids"]).logits
        l2 = again.module(input_ids=batch["input_ids"]).logits
    assert torch.equal(l1, l2)
    np.testing.assert_array_equal(model.generate("x", max_frames=3), again.generate("x", max_frames=3))
    plain = LlamaForCausalLM.from_pretrained(str(tmp_path / "m"))
    with torch.no_grad():
        assert torch.equal(plain(input_ids=batch["input_ids"]).logits, l1)


def test_incomplete_folder_is_refused(tmp_path: Path) -> None:
    model = tiny_model()
    model.module.save_pretrained(str(tmp_path / "m"))  # no voxrelay.json: an interrupted save
    with pytest.raises(FileNotFoundError, match="voxrelay.json"):
        CodecLM.from_pretrained(tmp_path / "m")
    with pytest.raises(UserError, match="voxrelay.json"):
        CodecLM.from_pretrained(tmp_path / "m")


def test_init_from_plain_lm_resizes_embeddings(tmp_path: Path) -> None:
    from transformers import LlamaConfig

    torch.manual_seed(0)
    lm = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=300,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
        )
    )
    lm.save_pretrained(str(tmp_path / "lm"))
    model = CodecLM.build(tiny_cfg(init_from=str(tmp_path / "lm")), K, C, [], seed=0)
    assert model.layout.text_vocab == 300 and model.module.config.vocab_size == 300 + 4 + K * C
    emb = model.module.get_input_embeddings().weight
    assert torch.equal(emb[:300], lm.get_input_embeddings().weight)
    assert model.generate("hi", max_frames=2).shape[0] == K


def test_init_from_voxrelay_folder(tmp_path: Path) -> None:
    model = tiny_model(seed=5)
    model.save_pretrained(tmp_path / "m")
    again = CodecLM.build(tiny_cfg(init_from=str(tmp_path / "m")), K, C, ["new"], seed=0)
    assert again.layout == model.layout and again.speakers == ["new"]
    assert torch.equal(again.module.lm_head.weight, model.module.lm_head.weight)
    with pytest.raises(ValueError, match="codebooks"):
        CodecLM.build(tiny_cfg(init_from=str(tmp_path / "m")), K + 1, C, [], seed=0)


def _save_plain_lm(folder: Path, **kw) -> None:
    from transformers import LlamaConfig

    base = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    LlamaForCausalLM(LlamaConfig(**{**base, **kw})).save_pretrained(str(folder))


def test_bad_init_from_names_the_key_and_the_fix(tmp_path: Path) -> None:
    def build(source: Path) -> CodecLM:
        return CodecLM.build(tiny_cfg(init_from=str(source)), K, C, [], seed=0)

    with pytest.raises(UserError, match=r"model.init_from='.*absent': no such folder"):
        build(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"model.init_from='.*empty': the folder has no config.json"):
        build(tmp_path / "empty")
    _save_plain_lm(tmp_path / "no-weights")
    (tmp_path / "no-weights" / "model.safetensors").unlink()
    with pytest.raises(UserError, match=r"no-weights' cannot be loaded as a local folder"):
        build(tmp_path / "no-weights")


def test_init_from_weights_that_do_not_fit_are_refused(tmp_path: Path) -> None:
    _save_plain_lm(tmp_path / "lm")
    config = json.loads((tmp_path / "lm" / "config.json").read_text())
    (tmp_path / "lm" / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    with pytest.raises(UserError, match="its weights do not fit its config.json"):
        CodecLM.build(tiny_cfg(init_from=str(tmp_path / "lm")), K, C, [], seed=0)
    # one layer of weights for a two-layer config: the second layer would silently start random
    (tmp_path / "lm" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    with pytest.raises(UserError, match=r"its weights lack 9 tensors .*model.layers.1."):
        CodecLM.build(tiny_cfg(init_from=str(tmp_path / "lm")), K, C, [], seed=0)
