"""Records that flow from the source readers into ``prepare``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Utterance:
    """One row of a source, before validation.

    Either ``audio_path`` (a local file or a ``gs://`` / ``s3://`` URI) or ``audio`` + ``sample_rate`` (decoded
    samples) is set.
    ``where`` names the row for error messages, e.g. ``"data/metadata.csv row 12"``.
    ``voice_prompts``: audio-only utterances, one reference clip per speaker of the transcript in the order of
    its labels (:mod:`voxrelay.data.voice_prompts`), for a family that clones voices from prompts.
    ``conversation`` / ``turn``: the conversation a row is one turn of and its place in it (a family that takes the
    previous turns as context orders a conversation's rows by turn, then id).
    ``problem`` is set by a reader when the row is already known to be bad (empty text, a path
    that escapes the dataset folder, a missing text file...); prepare rejects it with that reason.
    """

    id: str
    text: str
    where: str
    audio_path: str | None = None
    audio: np.ndarray | None = None
    sample_rate: int | None = None
    speaker: str | None = None
    description: str | None = None
    num_speakers: int | None = None
    conversation: str | None = None
    turn: int | None = None
    problem: str | None = None
    voice_prompts: list[Utterance] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


@dataclass
class PrepareReport:
    """What a ``prepare`` did: ``counts`` (train, eval, rejected; empty on a rank that does not report),
    ``rejects`` (every one), shards written and reused, and ``note``: a line to show before the summary."""

    prepared_uri: str
    counts: dict[str, int]
    hours: float
    rejects: list[dict] = field(default_factory=list)
    skipped_shards: int = 0
    written_shards: int = 0
    note: str | None = None


class RowError(ValueError):
    """A row that cannot be used; the message says why and how to fix it."""
