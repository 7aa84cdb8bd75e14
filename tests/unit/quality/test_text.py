"""WER/CER as the field computes them: Whisper's English normaliser and jiwer's edit counts, against
hand-worked examples."""

from __future__ import annotations

import json

import pytest

from voxrelay.quality import text
from voxrelay.quality.text import Errors, errors, normalize, set_errors, spelling_map, use_spelling_map


@pytest.mark.parametrize(("raw", "norm"), [
    ("Did Felix carry the ladder?", "did felix carry the ladder"),
    ("It costs forty two coins.", "it costs 42 coins"),  # spelled-out numbers become digits
    ("Room three hundred and forty two, floor 7", "room 342 floor 7"),
    ("Mr. Smith didn't come", "mister smith did not come"),
    ("Mara\u2019s well-known   map [laughs]", "mara s well known map"),
    ("one two three four", "1234"),  # Whisper's choice: adjacent number words are one number
])
def test_normalize_is_whispers(raw, norm):
    assert normalize(raw) == norm


def test_wer_and_cer_of_an_utterance():
    e = errors("The baker laughed.", "the baker left")
    assert (e.word_edits, e.ref_words) == (1, 3)
    assert e.wer == pytest.approx(1 / 3)
    # characters, spaces included
    assert e.ref_chars == len("the baker laughed")
    assert e.char_edits == 6  # l(a->e)(u->f)(g->t), delete h, e, d


def test_numbers_in_digits_or_words_score_the_same():
    assert errors("It costs 42 coins.", "it costs forty two coins").wer == 0.0


def test_set_wer_sums_edits_over_the_set_not_a_mean_of_rates():
    refs = ["the cat sat on the mat", "go home"]
    hyps = ["the cat sat on the mat", "go"]
    total = set_errors(refs, hyps)
    assert (total.word_edits, total.ref_words) == (1, 8)
    assert total.wer == pytest.approx(1 / 8)  # a mean of per-utterance rates would say 0.25
    assert (total.char_edits, total.ref_chars) == (len(" home"), len("the cat sat on the mat") + len("go home"))


def test_insertions_can_take_wer_above_one_and_an_empty_reference_counts_them():
    assert errors("yes", "no no no").wer == pytest.approx(3.0)
    assert errors("", "x y") == Errors(2, 0, 3, 0)


def test_the_spelling_map_is_used_when_the_model_folder_ships_one(tmp_path):
    assert errors("the colour", "the color").word_edits == 1 and not spelling_map()
    (tmp_path / "normalizer.json").write_text(json.dumps({"colour": "color"}))
    try:
        assert use_spelling_map(tmp_path) and spelling_map()
        assert errors("the colour", "the color").word_edits == 0
    finally:
        assert not use_spelling_map(None)
    assert errors("the colour", "the color").word_edits == 1 and text._SPELLING == {}


def test_each_language_has_its_normaliser_and_the_scores_name_it(tmp_path):
    """English: Whisper's English rules (diacritics dropped, Mr -> mister); any other language: Whisper's basic
    normaliser, which keeps what its words are spelt with."""
    assert errors("Er ist schön.", "er ist schon", "en").word_edits == 0
    assert errors("Er ist schön.", "er ist schon", "de").word_edits == 1
    assert normalize("Mr. Smith didn't pay!", "en") == "mister smith did not pay"
    assert normalize("Mr. Smith didn't pay!", "pl") == "mr smith didn t pay"
    assert normalize("今天的天气真不错,适合出去散步。", "zh") == "今天的天气真不错 适合出去散步"
    assert (text.normaliser("en"), text.normaliser("zh")) == ("Whisper's English normaliser without its spelling map",
                                                            "Whisper's basic normaliser")
    (tmp_path / "normalizer.json").write_text(json.dumps({"colour": "color"}))
    try:
        assert use_spelling_map(tmp_path)
        assert text.normaliser("en") == "Whisper's English normaliser with its spelling map"
    finally:
        use_spelling_map(None)
