"""Transcripts and dialogue scripts: [SPEAKER_X] tags or 'Speaker N:' labels (any case), plain text as one
speaker; a transcript whose speakers do not match num_speakers or the speaker column is refused."""

from __future__ import annotations

import re

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
