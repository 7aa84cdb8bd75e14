"""Transcripts and dialogue scripts: [SPEAKER_X] tags or 'Speaker N:' labels (any case), plain text as one
speaker; a transcript whose speakers do not match num_speakers or the speaker column is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from voxrelay.models.vibevoice.script import ScriptError, Turn, check_transcript, parse_script, voices_of


def test_tags_are_numbered_in_label_order_whatever_the_case():
    turns, labels = parse_script("[SPEAKER_B] Hi there.\n[speaker_a] Hello.\n\n[Speaker_B]  Bye. ")
    assert labels == ["A", "B"]
    assert turns == [Turn(1, "Hi there."), Turn(0, "Hello."), Turn(1, "Bye.")]


def test_named_labels_and_plain_text():
    turns, labels = parse_script("Speaker 1: One.\nspeaker 2 : Two.\nSPEAKER 1:Three.")
    assert labels == ["1", "2"] and [t.speaker for t in turns] == [0, 1, 0] and turns[2].text == "Three."
    assert parse_script("Just one voice,\nover two lines.") == ([Turn(0, "Just one voice, over two lines.")], [""])


@pytest.mark.parametrize(("text", "message"), [
    ("[SPEAKER_A] Hi.\nno label here", "line 2 has no speaker label"),
    ("[SPEAKER_A] Hi.\nSpeaker 1: Hey.", "mixes"),
    ("[SPEAKER_A]   \n[SPEAKER_B] x", "line 1 (speaker A) says nothing"),
    ("  \n ", "empty"),
])
def test_unreadable_scripts_name_the_line(text, message):
    with pytest.raises(ScriptError, match=re.escape(message)):
        parse_script(text)


def test_a_transcript_is_checked_against_num_speakers_and_the_voices_named():
    two = "[SPEAKER_A] Hi.\n[SPEAKER_B] Hello."
    assert check_transcript(two, 2, "alice,bob") is None and check_transcript(two, None, None) is None
    assert "num_speakers is 3 but the transcript has 2 speaker(s) (A, B)" in check_transcript(two, 3, None)
    assert "num_speakers is 2 but the transcript has 1 speaker(s) (no speaker tags)" in check_transcript("Hi.", 2, None)
    assert "names 3 voice(s)" in check_transcript(two, 2, "a,b,c")
    assert check_transcript("[SPEAKER_A] Hi.\nhello", 1, None).startswith("transcript: line 2")
    assert voices_of(" alice , bob,") == ["alice", "bob"] and voices_of(None) == []


def test_wer_is_scored_against_what_a_script_says_aloud():
    """A dialogue's speaker labels are not spoken: a perfect transcript of it has no word errors."""
    from voxrelay.models.vibevoice.script import spoken
    from voxrelay.quality.text import errors

    script = "[SPEAKER_A] Hello there.\n[speaker_b] Hi, how are you?"
    assert spoken(script) == "Hello there. Hi, how are you?"
    assert errors(spoken(script), "hello there hi how are you").wer == 0.0
    # (Whisper's normaliser drops bracketed text too; a label without brackets would be scored as words)
    assert spoken("Just one voice.") == "Just one voice."


SEED_003 = Path(__file__).parents[2] / "fixtures" / "vibevoice" / "seed003"


def test_seed_003s_one_line_dialogue_is_three_turns_of_two_speakers():
    """Seed 003 writes a whole dialogue on one line (its line 175, transcribed verbatim in the fixture)."""
    text = (SEED_003 / "text" / "d001.txt").read_text(encoding="utf-8")
    assert text.count("\n") == 1 and text.count("[SPEAKER_") == 3
    turns, labels = parse_script(text)
    assert labels == ["A", "B"]
    assert turns == [Turn(0, "今天的天气真不错,适合出去散步。"), Turn(1, "是啊,阳光明媚,心情都变好了。"),
                     Turn(0, "要不要一起去公园?")]
    assert check_transcript(text, 2, None) is None


def test_tags_anywhere_on_a_line_with_full_width_punctuation_and_mixed_layouts():
    """One turn per line and several turns on one line in the same file; a tag right after full-width
    punctuation (no space), full-width brackets and colons, an ideographic space."""
    text = (SEED_003 / "text" / "d002.txt").read_text(encoding="utf-8")
    assert parse_script(text) == ([Turn(0, "周末你有什么安排？"), Turn(1, "还没想好，你呢？"), Turn(0, "我想去爬山。"),
                                   Turn(1, "好主意，一起去吧！")], ["A", "B"])
    assert parse_script("【SPEAKER_A】你好。\u3000［speaker_b］你好！")[0] == [Turn(0, "你好。"), Turn(1, "你好！")]
    assert parse_script("Speaker 1：早上好。 Speaker 2: 早！\nSpeaker 1: Fine. speaker 2 : Good.")[0] == [
        Turn(0, "早上好。"), Turn(1, "早！"), Turn(0, "Fine."), Turn(1, "Good.")]
    # a label needs a boundary before it: words that merely end in "speaker 2:" are text
    assert parse_script("Speaker 0: Ask the loudspeaker 2: it answers.")[0] == [
        Turn(0, "Ask the loudspeaker 2: it answers.")]


@pytest.mark.parametrize(("text", "message"), [
    ("Hello [SPEAKER_A] Hi.", "line 1 starts without a speaker label ('Hello')"),
    ("[SPEAKER_A] Hi. [SPEAKER_B]", "line 1 (speaker B) says nothing"),
    ("[SPEAKER_A] Hi. Speaker 1: Hey.", "mixes"),
])
def test_one_line_scripts_that_cannot_be_read_name_the_line(text, message):
    with pytest.raises(ScriptError, match=re.escape(message)):
        parse_script(text)
