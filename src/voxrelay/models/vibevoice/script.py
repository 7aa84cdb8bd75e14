"""Dialogue scripts and transcripts: ``[SPEAKER_A] ...`` or ``Speaker 0: ...`` turns, or plain text (one
speaker). No torch: ``prepare`` checks rows with it before any model is built.

A line holds one turn or several: seed 003 writes a whole dialogue on one line
(``[SPEAKER_A] 今天的天气真不错... [SPEAKER_B] 是啊... [SPEAKER_A] 要不要一起去公园?``); files may mix that with
one turn per line. ``[SPEAKER_X]`` tags are found anywhere (full-width brackets ``［］`` ``【】`` too);
``Speaker N:`` labels (a full-width ``：`` too) wherever no letter or digit comes just before them (so
"loudspeaker 2:" stays text). Every line starts with a label.

Labels are matched case-insensitively (``speaker 0:`` = ``Speaker 0:``, ``[speaker_a]`` = ``[SPEAKER_A]``)
and numbered 0, 1, ... in their sorted order (A, B, ... or 0, 1, ...): the chat roles of the model. A row's
``speaker`` column may name its voices in that order, comma-separated (``alice,bob``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

_TAG = re.compile(r"[\[［【]\s*speaker[_ ]?([a-z0-9]+)\s*[\]］】]", re.IGNORECASE)
_NAMED = re.compile(r"(?<![A-Za-z0-9_])speaker\s*([0-9]+)\s*[:：]", re.IGNORECASE)
_FORMS = {"[SPEAKER_X] tags": _TAG, "'Speaker N:' labels": _NAMED}


class ScriptError(ValueError):
    """A transcript or script that cannot be read as turns of speakers; the message names the line and the fix."""


class Turn(NamedTuple):
    speaker: int  # 0, 1, ... (the label's rank among the script's labels)
    text: str


def _label_key(label: str) -> tuple[int, int | str]:
    return (0, int(label)) if label.isdigit() else (1, label)


def _labelled(n: int, line: str) -> tuple[set[str], list[tuple[str, str]]]:
    """The label forms a line uses and its turns ``(label, text)``; no turns when it has no label."""
    marks = sorted(((m, form) for form, pattern in _FORMS.items() for m in pattern.finditer(line)),
                   key=lambda mark: mark[0].start())
    if not marks:
        return set(), []
    head = line[: marks[0][0].start()].strip()
    if head:
        raise ScriptError(f"line {n} starts without a speaker label ({head[:20]!r}); start it with [SPEAKER_X] or "
                          "'Speaker N:'")
    turns = []
    for i, (m, _) in enumerate(marks):
        end = marks[i + 1][0].start() if i + 1 < len(marks) else len(line)
        label, said = m.group(1).upper(), line[m.end():end].strip()
        if not said:
            raise ScriptError(f"line {n} (speaker {label}) says nothing")
        turns.append((label, said))
    return {form for _, form in marks}, turns


def parse_script(text: str) -> tuple[list[Turn], list[str]]:
    """The turns of ``text`` and its labels in speaker order (upper-cased: ``["A", "B"]`` or ``["0", "1"]``).
    Text without any speaker label is one turn of speaker 0 (label ``""``); a script that labels some lines
    and not others, or mixes ``[SPEAKER_X]`` with ``Speaker N:``, raises :class:`ScriptError` naming the line."""
    lines = [(i + 1, line) for i, line in enumerate(text.splitlines()) if line.strip()]
    found = [(n, *_labelled(n, line)) for n, line in lines]
    if not any(turns for _, _, turns in found):
        plain = " ".join(line.strip() for _, line in lines)
        if not plain:
            raise ScriptError("the text is empty")
        return [Turn(0, plain)], [""]
    if len(set().union(*(forms for _, forms, _ in found))) > 1:
        raise ScriptError("mixes [SPEAKER_X] tags with 'Speaker N:' labels; use one form")
    raw: list[tuple[str, str]] = []
    for n, _, turns in found:
        if not turns:
            raise ScriptError(f"line {n} has no speaker label; start every line with [SPEAKER_X] or 'Speaker N:' "
                              "(a line may hold several turns)")
        raw += turns
    labels = sorted({label for label, _ in raw}, key=_label_key)
    rank = {label: i for i, label in enumerate(labels)}
    return [Turn(rank[label], said) for label, said in raw], labels


def check_transcript(text: str, num_speakers: int | None, speaker: str | None, voice_prompts: int = 0) -> str | None:
    """Why a prepared row cannot be used (its transcript's speakers against ``num_speakers``, the voices its
    ``speaker`` column names and the number of clips its ``voice_prompts`` column names), or None."""
    try:
        turns, labels = parse_script(text)
    except ScriptError as e:
        return f"transcript: {e}"
    count = len(labels)
    if num_speakers is not None and num_speakers != count:
        named = ", ".join(labels) if labels != [""] else "no speaker tags"
        return (f"num_speakers is {num_speakers} but the transcript has {count} speaker(s) ({named}); fix the "
                "metadata or label every turn with [SPEAKER_A], [SPEAKER_B], ...")
    voices = voices_of(speaker)
    if count > 1 and voices and len(voices) != count:
        return (f"the speaker column names {len(voices)} voice(s) ({speaker}) but the transcript has {count} speakers; "
                "list one voice per speaker, comma-separated, in the order of their tags")
    if voice_prompts and voice_prompts != count:
        return (f"voice_prompts names {voice_prompts} clip(s) but the transcript has {count} speaker(s); give one clip "
                "per speaker, separated by ';' in metadata.csv (a list in JSONL), in the order of their labels "
                "([SPEAKER_A] or Speaker 0 first)")
    return None


def voices_of(speaker: str | None) -> list[str]:
    """The voices a ``speaker`` column names (comma-separated), in speaker order."""
    return [v.strip() for v in (speaker or "").split(",") if v.strip()]


def spoken(text: str) -> str:
    """What a script says aloud: its turns' text without speaker labels (what WER is scored against)."""
    return " ".join(t.text for t in parse_script(text)[0])
