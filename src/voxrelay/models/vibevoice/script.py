"""Dialogue scripts and transcripts: ``[SPEAKER_A] ...`` or ``Speaker 0: ...`` lines, or plain text (one
speaker). No torch: ``prepare`` checks rows with it before any model is built.

Labels are matched case-insensitively (``speaker 0:`` = ``Speaker 0:``, ``[speaker_a]`` = ``[SPEAKER_A]``)
and numbered 0, 1, ... in their sorted order (A, B, ... or 0, 1, ...): the chat roles of the model. A row's
``speaker`` column may name its voices in that order, comma-separated (``alice,bob``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

_TAG = re.compile(r"^\s*\[\s*speaker[_ ]?([a-z0-9]+)\s*\]\s*(.*)$", re.IGNORECASE)
_NAMED = re.compile(r"^\s*speaker\s*([0-9]+)\s*:\s*(.*)$", re.IGNORECASE)


class ScriptError(ValueError):
    """A transcript or script that cannot be read as turns of speakers; the message names the line and the fix."""


class Turn(NamedTuple):
    speaker: int  # 0, 1, ... (the label's rank among the script's labels)
    text: str


def _label_key(label: str) -> tuple[int, int | str]:
    return (0, int(label)) if label.isdigit() else (1, label)


def parse_script(text: str) -> tuple[list[Turn], list[str]]:
    """The turns of ``text`` and its labels in speaker order (upper-cased: ``["A", "B"]`` or ``["0", "1"]``).
    Text without any speaker label is one turn of speaker 0 (label ``""``); a script that labels some lines
    and not others, or mixes ``[SPEAKER_X]`` with ``Speaker N:``, raises :class:`ScriptError` naming the line."""
    lines = [(i + 1, line) for i, line in enumerate(text.splitlines()) if line.strip()]
    found = [(n, _TAG.match(line), _NAMED.match(line)) for n, line in lines]
    if not any(tag or named for _, tag, named in found):
        plain = " ".join(line.strip() for _, line in lines)
        if not plain:
            raise ScriptError("the text is empty")
        return [Turn(0, plain)], [""]
    if any(tag for _, tag, _ in found) and any(named for _, _, named in found):
        raise ScriptError("mixes [SPEAKER_X] tags with 'Speaker N:' labels; use one form")
    raw: list[tuple[str, str]] = []
    for n, tag, named in found:
        match = tag or named
        if match is None:
            raise ScriptError(f"line {n} has no speaker label; start every line with [SPEAKER_X] or 'Speaker N:'")
        label, said = match.group(1).upper(), match.group(2).strip()
        if not said:
            raise ScriptError(f"line {n} (speaker {label}) says nothing")
        raw.append((label, said))
    labels = sorted({label for label, _ in raw}, key=_label_key)
    rank = {label: i for i, label in enumerate(labels)}
    return [Turn(rank[label], said) for label, said in raw], labels


def check_transcript(text: str, num_speakers: int | None, speaker: str | None) -> str | None:
    """Why a prepared row cannot be used (its transcript's speakers against ``num_speakers`` and the voices
    its ``speaker`` column names), or None."""
    try:
        turns, labels = parse_script(text)
    except ScriptError as e:
        return f"transcript: {e}"
    count = len(labels)
    if num_speakers is not None and num_speakers != count:
        named = ", ".join(labels) if labels != [""] else "no speaker tags"
        return (f"num_speakers is {num_speakers} but the transcript has {count} speaker(s) ({named}); fix the "
                "metadata or tag every line with [SPEAKER_A], [SPEAKER_B], ...")
    voices = voices_of(speaker)
    if count > 1 and voices and len(voices) != count:
        return (f"the speaker column names {len(voices)} voice(s) ({speaker}) but the transcript has {count} speakers; "
                "list one voice per speaker, comma-separated, in the order of their tags")
    return None


def voices_of(speaker: str | None) -> list[str]:
    """The voices a ``speaker`` column names (comma-separated), in speaker order."""
    return [v.strip() for v in (speaker or "").split(",") if v.strip()]


def spoken(text: str) -> str:
    """What a script says aloud: its turns' text without speaker labels (what WER is scored against)."""
    return " ".join(t.text for t in parse_script(text)[0])
