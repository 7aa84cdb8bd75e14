"""The WER/CER text normaliser and edit counts, against hand-worked examples."""

from __future__ import annotations

import pytest

from voxrelay.quality.text import Errors, edit_distance, errors, normalize, set_errors


@pytest.mark.parametrize(("raw", "norm"), [
    ("Did Felix carry the ladder?", "did felix carry the ladder"),
    ("It costs 42 coins.", "it costs forty two coins"),
    ("Room 342, floor 7", "room three hundred and forty two floor seven"),
    ("Call 12345 now", "call 12345 now"),  # only 0-999 are spelled out
    ("Mara\u2019s well-known   map", "mara's well known map"),
    ("'Quoted' words -- and 'em", "quoted words and em"),
    ("CAF\u00c9 na\u00efve", "caf\u00e9 na\u00efve"),
])
def test_normalize(raw, norm):
    assert normalize(raw) == norm


def test_edit_distance_counts_substitutions_deletions_insertions():
    assert edit_distance("a b c d".split(), "a x c d e".split()) == 2  # b->x, +e
    assert edit_distance([], list("abc")) == 3
    assert edit_distance(list("kitten"), list("sitting")) == 3


def test_wer_and_cer_of_an_utterance():
    e = errors("The baker laughed.", "the baker left")
    assert (e.word_edits, e.ref_words) == (1, 3)
    assert e.wer == pytest.approx(1 / 3)
    # characters without spaces: "thebakerlaughed" vs "thebakerleft" differ only in laughed/left
    assert e.char_edits == edit_distance(list("laughed"), list("left")) == 6
    assert e.ref_chars == len("thebakerlaughed")


def test_set_wer_sums_edits_over_the_set_not_a_mean_of_rates():
    refs = ["one two three four", "five"]
    hyps = ["one two three four", ""]
    total = set_errors(refs, hyps)
    assert total == Errors(1, 5, 4, len("onetwothreefour") + 4)
    assert total.wer == pytest.approx(0.2)  # a mean of per-utterance rates would say 0.5


def test_insertions_can_take_wer_above_one():
    assert errors("yes", "no no no").wer == pytest.approx(3.0)
