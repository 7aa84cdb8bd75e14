"""Text normalisation and error rates for intelligibility scoring (WER and CER), as the field computes them.

English texts (``eval.asr.language: en``) go through Whisper's English text normaliser (``EnglishTextNormalizer``,
which transformers ships; most published English TTS evaluations use it): lower case, brackets and fillers
removed, contractions and abbreviations expanded (``didn't`` -> ``did not``, ``Mr`` -> ``mister``),
spelled-out numbers to digits (``three hundred and forty two`` -> ``342``), punctuation to spaces,
runs of spaces collapsed. Its British-to-American spelling map is used when ``normalizer.json`` (as the
``openai/whisper-*`` repositories ship it) is in the Whisper model's folder, else none (``neighbour`` and
``neighbor`` then differ, and the name says "without its spelling map"); :func:`spelling_map` says which.
Texts of any other language go through Whisper's basic normaliser (``BasicTextNormalizer``, what Whisper's own
evaluation uses for them): lower case, brackets and symbols removed (marks kept), runs of spaces collapsed; no
English rules. :func:`normaliser` names the one used:
every score says it beside the ASR model (see :meth:`voxrelay.quality.asr.Transcriber.describe`).

The edit counts come from jiwer (rapidfuzz underneath). WER = word-level edits (substitutions, deletions,
insertions) / reference words, over a whole set of utterances (the sums, not a mean of per-utterance
rates); CER the same over characters, spaces included (jiwer's convention). Both can exceed 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jiwer

_SPELLING: dict[str, str] = {}


def use_spelling_map(model_folder: str | Path | None) -> bool:
    """Use the spelling map in ``<model_folder>/normalizer.json`` when there is one; True when it is used."""
    path = Path(model_folder) / "normalizer.json" if model_folder else None
    mapping = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    if mapping != _SPELLING:
        _SPELLING.clear()
        _SPELLING.update(mapping)
        _normalizer.cache_clear()
    return bool(mapping)


def spelling_map() -> bool:
    """Whether a British-to-American spelling map is in use."""
    return bool(_SPELLING)


def normaliser(language: str = "en") -> str:
    """The name of the normaliser WER/CER of ``language`` are computed after, as every score states it."""
    if language != "en":
        return "Whisper's basic normaliser"
    return "Whisper's English normaliser" + (" with its spelling map" if _SPELLING else " without its spelling map")


@cache
def _normalizer(english: bool = True):
    from transformers.models.whisper.english_normalizer import BasicTextNormalizer, EnglishTextNormalizer

    return EnglishTextNormalizer(dict(_SPELLING)) if english else BasicTextNormalizer()


def normalize(text: str, language: str = "en") -> str:
    """The normalised form of ``text`` in ``language`` (see the module docstring)."""
    return " ".join(_normalizer(language == "en")(text).split())


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


def _edits(out) -> int:
    return out.substitutions + out.deletions + out.insertions


def errors(reference: str, hypothesis: str, language: str = "en") -> Errors:
    """Word and character edits of ``hypothesis`` against ``reference`` (both normalised here, as ``language``)."""
    ref, hyp = normalize(reference, language), normalize(hypothesis, language)
    words, chars = jiwer.process_words(ref, hyp), jiwer.process_characters(ref, hyp)
    return Errors(_edits(words), len(ref.split()), _edits(chars), len(ref))


def set_errors(references: list[str], hypotheses: list[str], language: str = "en") -> Errors:
    """Errors of a set of utterances: the sums of their edits and reference lengths."""
    total = Errors(0, 0, 0, 0)
    for ref, hyp in zip(references, hypotheses, strict=True):
        total = total + errors(ref, hyp, language)
    return total
