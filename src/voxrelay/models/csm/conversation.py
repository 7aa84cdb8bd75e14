"""Examples of the ``csm`` family: a turn of a conversation after its previous turns, as CSM reads them.

One example (``K`` codebooks; ``T_i`` Mimi frames of turn ``i``)::

    <|begin_of_text|>[0]first turn's text<|end_of_text|>  <frame> x T_0  <end-of-audio frame>     <- context
    <|begin_of_text|>[1]second turn's text<|end_of_text|> <frame> x T_1  <end-of-audio frame>     <- the row

as transformers' CSM chat template renders a conversation (``{bos}[{role}]{text}{eos}`` then the audio) and its
processor expands it (one position per Mimi frame, then one for the end of the audio). ``input_ids`` [S] holds the
text ids, ``audio_token_id`` at a frame and ``audio_eos_token_id`` at the end of a turn's audio; ``codes`` [S, K]
the frame's codes there (the end frame: all ``codebook_eos_token_id``) and 0 elsewhere; ``labels`` [S, K] the codes
of the frames learned, -100 elsewhere. Context turns are the rows of the same ``conversation`` before the row (by
``turn``, then id) in the training split, nearest first, at most ``context_turns`` and as many as ``max_seq_len``
leaves room for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from voxrelay.models.base import num_frames, with_counts

IGNORE = -100
TEXT_CACHE = 65536  # turns' token ids kept (a row's context turns are tokenized again for each later turn)


@dataclass(frozen=True)
class Ids:
    """The model's ids: ``bos``/``eos`` of the tokenizer, the audio markers of the config, K codebooks."""

    bos: str
    eos: str
    audio: int
    audio_eos: int
    codebook_eos: int
    num_codebooks: int


def depth_frames(frames: int, share: float) -> int:
    """How many of a target's ``frames`` the depth decoder learns at a step (its end frame comes on top)."""
    return math.floor(frames * share + 0.5)


def role(speaker: str | None, speakers: Sequence[str]) -> str:
    """The speaker id CSM reads (``[0]``): a digit speaker as it is (upstream datasets number the speakers of a
    conversation), another name its place among the data's ``speakers``, none 0."""
    if speaker is None:
        return "0"
    if speaker.isdigit():
        return str(int(speaker))
    return str(speakers.index(speaker)) if speaker in speakers else "0"


@dataclass
class Conversations:
    """Each training row's previous turns (:meth:`use`), and the token ids of a turn's text."""

    tokenizer: Any
    ids: Ids
    speakers: list[str]
    context_turns: int
    max_len: int
    before: dict[str, list[Any]] = field(default_factory=dict)  # row id -> the rows before it, nearest last
    _text: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def use(self, rows: Sequence[Any]) -> None:
        """Index the training rows by conversation (rows without one have no context)."""
        talks: dict[str, list[Any]] = {}
        for row in rows:
            if getattr(row, "conversation", None):
                talks.setdefault(row.conversation, []).append(row)
        self.before = {}
        for turns in talks.values():
            turns.sort(key=lambda r: (r.turn is None, r.turn if r.turn is not None else 0, r.id))
            for i, row in enumerate(turns):
                self.before[row.id] = turns[max(0, i - self.context_turns):i] if self.context_turns else []

    def text_ids(self, text: str, speaker: str | None) -> list[int]:
        """``{bos}[{role}]{text}{eos}`` tokenized without added special tokens (the chat template's rendering)."""
        key = (text, role(speaker, self.speakers))
        if key not in self._text:
            if len(self._text) >= TEXT_CACHE:  # a big corpus' every text would stay in memory: start afresh
                self._text.clear()
            self._text[key] = self.tokenizer(f"{self.ids.bos}[{key[1]}]{text}{self.ids.eos}",
                                             add_special_tokens=False)["input_ids"]
        return self._text[key]

    def turn_length(self, row: Any) -> int:
        return len(self.text_ids(row.text, row.speaker)) + num_frames(row) + 1

    def context(self, row: Any) -> list[Any]:
        """The previous turns given with ``row``: nearest first back to ``context_turns``, while they fit."""
        room = self.max_len - self.turn_length(row)
        chosen: list[Any] = []
        for prev in reversed(self.before.get(row.id, [])):
            room -= self.turn_length(prev)
            if room < 0:
                break
            chosen.insert(0, prev)
        return chosen

    def length(self, row: Any) -> int:
        return sum(self.turn_length(r) for r in [*self.context(row), row])

    def segment(self, text: str, speaker: str | None, codes: np.ndarray | None, learn: bool
                ) -> tuple[list[int], np.ndarray, np.ndarray]:
        """One turn: ids [n], codes [n, K], labels [n, K] (codes int [K, T], None: its text alone)."""
        k = self.ids.num_codebooks
        ids = list(self.text_ids(text, speaker))
        frames = np.zeros((len(ids), k), dtype=np.int64)
        if codes is None:
            return ids, frames, np.full_like(frames, IGNORE)
        audio = np.concatenate([np.asarray(codes, dtype=np.int64).T,
                                np.full((1, k), self.ids.codebook_eos, dtype=np.int64)])
        ids += [self.ids.audio] * (len(audio) - 1) + [self.ids.audio_eos]
        frames = np.concatenate([frames, audio])
        labels = np.concatenate([np.full((len(frames) - len(audio), k), IGNORE), audio if learn else
                                 np.full_like(audio, IGNORE)])
        return ids, frames, labels

    def example(self, row: Any, train_context: bool) -> dict[str, np.ndarray]:
        parts = [self.segment(r.text, r.speaker, r.codes, train_context) for r in self.context(row)]
        parts.append(self.segment(row.text, row.speaker, row.codes, True))
        return join(parts)


def join(parts: list[tuple[list[int], np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    return {"input_ids": np.asarray([i for p in parts for i in p[0]], dtype=np.int64),
            "codes": np.concatenate([p[1] for p in parts]), "labels": np.concatenate([p[2] for p in parts])}


def collate(examples: list[dict[str, np.ndarray]], ids: Ids, pad_id: int, share: float) -> dict[str, torch.Tensor]:
    """Right-pad (``pad_id``, attention 0, codes 0, labels -100), with the counts of :func:`counts`."""
    width = max(len(e["input_ids"]) for e in examples)
    k = ids.num_codebooks
    batch = {"input_ids": torch.full((len(examples), width), pad_id, dtype=torch.long),
             "attention_mask": torch.zeros((len(examples), width), dtype=torch.long),
             "codes": torch.zeros((len(examples), width, k), dtype=torch.long),
             "labels": torch.full((len(examples), width, k), IGNORE, dtype=torch.long)}
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        batch["input_ids"][i, :n] = torch.from_numpy(e["input_ids"])
        batch["attention_mask"][i, :n] = 1
        batch["codes"][i, :n] = torch.from_numpy(e["codes"])
        batch["labels"][i, :n] = torch.from_numpy(e["labels"])
    return with_counts(batch, counts(batch["input_ids"], batch["labels"], ids, share))


def counts(input_ids: torch.Tensor, labels: torch.Tensor, ids: Ids, share: float) -> dict[str, torch.Tensor]:
    """The targets of a batch's two loss terms: ``backbone``, the labelled frames after the causal shift (their
    first codebooks); ``depth``, (K - 1) x the frames the depth decoder learns (per example: ``share`` of its
    labelled frames, rounded, and its end frames)."""
    learned = labels[..., 0] != IGNORE
    frames = (learned & (input_ids == ids.audio)).sum(-1).tolist()
    ends = int((learned & (input_ids == ids.audio_eos)).sum())
    depth = sum(depth_frames(n, share) for n in frames) + ends
    return {"backbone": (labels[:, 1:, 0] != IGNORE).sum(), "depth": torch.tensor(depth * (ids.num_codebooks - 1))}
