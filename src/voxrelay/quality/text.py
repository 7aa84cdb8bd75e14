"""Text normalisation and error rates for intelligibility scoring (WER and CER).

The normaliser (keep it fixed: WERs are only comparable under one definition) applies, in order:
Unicode NFKC; lower case; curly apostrophes to ``'``; whole numbers 0-999 written in digits
spelled out the way the demo corpus writes them (``342`` -> ``three hundred and forty two``);
hyphens, slashes and every other character that is not a letter, a digit, an apostrophe or a
space become spaces; apostrophes not between two letters are dropped; runs of spaces collapse.
There is no spelling map: ``neighbour`` and ``neighbor`` differ.

WER = word-level edit distance (substitutions + deletions + insertions) / reference words, over a
whole set of utterances (the sums, not a mean of per-utterance rates); CER the same over the
characters of the normalised text without spaces. Both can exceed 1 (insertions).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from voxrelay.data.demo_text import spell_number

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})
_NUMBER = re.compile(r"\b\d{1,3}\b")
_NOT_WORDISH = re.compile(r"[^\w' ]|_")
_LOOSE_APOSTROPHE = re.compile(r"(?<![^\W\d_])'|'(?![^\W\d_])")


def normalize(text: str) -> str:
    """The normalised form of ``text`` (see the module docstring)."""
    text = unicodedata.normalize("NFKC", text).lower().translate(_APOSTROPHES)
    text = _NUMBER.sub(lambda m: " " + spell_number(int(m.group())) + " ", text)
    text = _NOT_WORDISH.sub(" ", text)
    text = _LOOSE_APOSTROPHE.sub("", text)
    return " ".join(text.split())


def edit_distance(ref: list, hyp: list) -> int:
    """Levenshtein distance between two sequences (unit costs)."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


@dataclass(frozen=True)
class Errors:
    """Edit counts of one utterance or a set: ``word_edits / ref_words`` is the WER."""

    word_edits: int
    ref_words: int
    char_edits: int
    ref_chars: int

    def __add__(self, other: Errors) -> Errors:
        return Errors(self.word_edits + other.word_edits, self.ref_words + other.ref_words,
                      self.char_edits + other.char_edits, self.ref_chars + other.ref_chars)

    @property
    def wer(self) -> float:
        return self.word_edits / max(self.ref_words, 1)

    @property
    def cer(self) -> float:
        return self.char_edits / max(self.ref_chars, 1)


def errors(reference: str, hypothesis: str) -> Errors:
    """Word and character edits of ``hypothesis`` against ``reference`` (both normalised here)."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    ref_chars, hyp_chars = list(ref.replace(" ", "")), list(hyp.replace(" ", ""))
    return Errors(edit_distance(ref.split(), hyp.split()), len(ref.split()),
                  edit_distance(ref_chars, hyp_chars), len(ref_chars))


def set_errors(references: list[str], hypotheses: list[str]) -> Errors:
    """Errors of a set of utterances: the sums of their edits and reference lengths."""
    total = Errors(0, 0, 0, 0)
    for ref, hyp in zip(references, hypotheses, strict=True):
        total = total + errors(ref, hyp)
    return total
