"""Text tokenizers of codec_lm: bytes and a HF tokenizer from a local folder (no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxrelay.errors import UserError
from voxrelay.models.codec_lm.tokenizer import (
    ByteTokenizer,
    HFTextTokenizer,
    load_saved_tokenizer,
    load_text_tokenizer,
)

SENTENCES = ["hello world", "the cat sat on the mat", "speech synthesis is fun", "hello cat"]


def make_hf_tokenizer(folder: Path) -> str:
    """Train a tiny WordLevel tokenizer, save it as a HF fast tokenizer folder, return its path."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.save_pretrained(str(folder))
    return str(folder)


def test_bytes_round_trip_utf8() -> None:
    tok = load_text_tokenizer("bytes")
    assert isinstance(tok, ByteTokenizer) and tok.vocab_size == 256
    ids = tok.encode("héllo 你好")
    assert all(0 <= i < 256 for i in ids) and len(ids) == len("héllo 你好".encode())
    assert tok.decode(ids) == "héllo 你好"
    with pytest.raises(ValueError, match="256"):
        tok.decode([300])


def test_hf_tokenizer_from_local_folder(tmp_path: Path) -> None:
    spec = make_hf_tokenizer(tmp_path / "tok")
    tok = load_text_tokenizer(spec)
    assert isinstance(tok, HFTextTokenizer) and tok.spec == spec
    ids = tok.encode("hello cat")
    assert len(ids) == 2 and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == "hello cat"
    assert tok.encode("zebra") == [tok.hf_tokenizer.unk_token_id]

    tok.save(tmp_path / "saved")
    again = load_saved_tokenizer(tmp_path / "saved")
    assert again.spec == spec and again.encode("hello cat") == ids and again.vocab_size == tok.vocab_size


def test_bad_spec_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"model.tokenizer='.*no-such-tokenizer': no such folder"):
        load_text_tokenizer(str(tmp_path / "no-such-tokenizer"))
    (tmp_path / "weights-only").mkdir()
    with pytest.raises(UserError, match="holds no tokenizer files"):
        load_text_tokenizer(str(tmp_path / "weights-only"))
    with pytest.raises(UserError, match="not written .completely. by TextTokenizer.save"):
        load_saved_tokenizer(tmp_path / "weights-only")


def test_hub_id_that_cannot_be_fetched_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network here: the hub lookup fails at once
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # (read at import: set both)
    with pytest.raises(UserError, match=r"model.tokenizer='nobody/nothing' as a hub id") as info:
        load_text_tokenizer("nobody/nothing")
    assert "\n" not in str(info.value)


def test_phonemes_spell_pronunciation_and_survive_a_save(tmp_path: Path) -> None:
    from voxrelay.models.codec_lm.tokenizer import PhonemeTokenizer

    tok = load_text_tokenizer("phonemes")
    assert isinstance(tok, PhonemeTokenizer) and tok.vocab_size == 256 and tok.spec == "phonemes"
    said = tok.decode(tok.encode("Did Felix carry the heavy ladder?"))
    assert said == "dˈɪd fˈiːlɪks kˈæɹi ðə hˈɛvi lˈædɚ"  # eSpeak NG's en-us rules, stress marks included
    # spelling differs, sound does not: the point of phoneme input
    assert tok.encode("Their knight") == tok.encode("There night")
    assert tok.decode(tok.encode("forty two, then stop.")) == "fˈɔːɹɾi tˈuː, ðˈɛn stˈɑːp"  # clauses joined by ", "
    british = load_text_tokenizer("phonemes:en-gb")
    assert british.spec == "phonemes:en-gb" and british.decode(british.encode("carry")) == "kˈaɹi"
    british.save(tmp_path / "tok")
    again = load_saved_tokenizer(tmp_path / "tok")
    assert isinstance(again, PhonemeTokenizer) and again.spec == "phonemes:en-gb"
    assert again.encode("carry") == british.encode("carry")


def test_a_phoneme_language_espeak_lacks_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"phonemes:xx-nope: eSpeak NG cannot phonemize it \(no such language\)"):
        load_text_tokenizer("phonemes:xx-nope")
