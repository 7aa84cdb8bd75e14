"""Examples of the ``vibevoice`` family: the chat-format text, voice prompts from other rows, padding.

One example (``n`` = latents of a clip, one per 3200 samples, rounded up)::

     Transform the text provided by various speakers into speech output, utilizing the distinct voice of each ...
     Voice input:                                   (only when some speaker has a prompt)
     Speaker 0:<|vision_start|><|vision_pad|> x n<|vision_end|>
     Text input:
     Speaker 0: first turn
     Speaker 1: second turn
     Speech output:
    <|vision_start|><|vision_pad|> x n<|vision_end|><|endoftext|>        <- the target: every token here is a
                                                                            CE target, each latent a diffusion one

Voice prompts: a row's own (its ``voice_prompts`` column, one clip per speaker, kept by ``prepare``); else for
speaker ``i`` of a row, another row whose only voice is the same voice (its ``speaker`` column names one voice,
the one the row names for ``i``), never the row itself, chosen by ``train.seed`` and the row's id. A speaker
without one goes without a prompt; ``voice_prompt_drop_rate`` of the rows (chosen the same way) train with none.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from voxrelay.models.base import num_frames, with_counts
from voxrelay.models.hf import ModelLoadError
from voxrelay.models.vibevoice.latent_codec import pcm16_normalized
from voxrelay.models.vibevoice.script import Turn, parse_script, voices_of

log = logging.getLogger(__name__)
SYSTEM = (" Transform the text provided by various speakers into speech output, utilizing the distinct voice of "
          "each respective speaker.\n")
AUDIO_BOS, AUDIO_EOS, AUDIO_PAD = "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>"


def render(turns: Sequence[Turn], prompted: Sequence[int]) -> str:
    """The chat text up to the target's ``<|vision_start|>``, with ONE ``<|vision_pad|>`` per voice prompt of the
    speakers in ``prompted`` (expanded to the prompt's latent count after tokenization)."""
    voice = "".join(f" Speaker {i}:{AUDIO_BOS}{AUDIO_PAD}{AUDIO_EOS}\n" for i in prompted)
    text = "".join(f" Speaker {t.speaker}: {t.text}\n" for t in turns)
    return SYSTEM + (" Voice input:\n" + voice if prompted else "") + " Text input:\n" + text + \
        " Speech output:\n" + AUDIO_BOS


def _unit(*parts: object) -> float:
    """A number in [0, 1) that depends only on ``parts`` (no global RNG: the same in every process and run)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class Prompt(NamedTuple):
    """The voice prompt of a speaker: the clip of ``row`` (another clip of the voice), or, with ``index``, the
    row's own ``voice_prompts[index]``."""

    row: object
    index: int | None = None

    @property
    def key(self) -> int:
        """The clip's key in the encoders' cache (:func:`clip_key`)."""
        return clip_key(self.row.id if self.index is None else f"{self.row.id}\x1fvoice prompt {self.index}")

    def size(self) -> int:
        """Frames of the stored clip (samples, or latents of stored features), from the row's metadata when it is
        the row's own clip."""
        if self.index is None:
            return num_frames(self.row)
        return int(np.asarray(self.row.voice_prompts[self.index]).shape[-1])

    def stored(self) -> np.ndarray:
        """The clip as prepared data stores it (int16 [1, N] audio, or float32 [D, T] features)."""
        return self.row.codes if self.index is None else self.row.voice_prompts[self.index]


@dataclass
class ExampleMaker:
    """Turns rows into token ids and clips. ``tokenizer``: the Qwen2 tokenizer; ``ids``: the special token ids
    (keys ``pad``, ``bos``, ``eos``, ``end``: ``<|vision_pad|>``, ``<|vision_start|>``, ``<|vision_end|>``,
    ``<|endoftext|>``); ``hop``: samples per latent; ``features``: the data stores the encoders' outputs
    (``codec.type: vibevoice_latents``, float32 [D, T] per clip) instead of the audio."""

    tokenizer: object
    ids: dict[str, int]
    hop: int
    seed: int
    drop_rate: float
    corpus: dict[str, list] | None = None  # voice -> rows with that voice alone (see use_corpus)
    features: bool = False

    def use_corpus(self, rows: Sequence) -> None:
        """The rows voice prompts are taken from: those whose speaker column names a single voice. Says (a
        warning) how many rows have no way to a prompt (no ``voice_prompts`` of their own, no ``speaker`` column),
        and which voices have no such clip: their speakers train without a prompt."""
        pool: dict[str, list] = {}
        named: set[str] = set()
        bare = 0
        for row in rows:
            voices = voices_of(getattr(row, "speaker", None))
            named.update(voices)
            bare += not voices and not getattr(row, "voice_prompts", ())
            if len(voices) == 1 and len(parse_script(row.text)[1]) == 1:
                pool.setdefault(voices[0], []).append(row)
        self.corpus = {voice: sorted(found, key=lambda r: r.id) for voice, found in pool.items()}
        if bare:
            log.warning("%d of %d training rows have no voice prompts (no `voice_prompts` column) and name no voices "
                        "(no `speaker` column): they train without voice prompts, so the model learns to clone "
                        "voices from fewer examples. Give each dialogue a `voice_prompts` column: one clip per "
                        "speaker, in the order of its labels (docs/models.md: VibeVoice, voice prompts)", bare,
                        len(rows))
        lonely = sorted(v for v in named if len(pool.get(v, [])) < 2)
        if lonely:
            log.warning("%d voice(s) have fewer than 2 one-voice clips, so some of their rows train without a voice "
                        "prompt (a prompt is another clip of the same voice, never the row itself): %s",
                        len(lonely), ", ".join(lonely[:8]))

    def latents(self, frames: int) -> int:
        """Latents of a stored clip of ``frames`` frames (samples of audio, or latents of features)."""
        return frames if self.features else math.ceil(frames / self.hop)

    def clip(self, stored: np.ndarray) -> np.ndarray:
        """A stored clip as training takes it: normalised samples [N], or features [T, D]."""
        return np.array(stored, dtype=np.float32).T if self.features else pcm16_normalized(stored)  # a copy: writable

    def count(self, clip: np.ndarray) -> int:
        """Latents of a clip as :meth:`clip` gives it."""
        return int(clip.shape[0]) if clip.ndim == 2 else math.ceil(len(clip) / self.hop)

    def prompts(self, row, count: int) -> dict[int, Prompt]:
        """Speaker -> the voice prompt each speaker of ``row`` gets (may be none): the row's own prompts when it
        has one per speaker, else other clips of the voices its speaker column names."""
        if _unit(self.seed, row.id, "drop") < self.drop_rate:
            return {}
        own = getattr(row, "voice_prompts", None) or ()
        if len(own) == count:
            return {i: Prompt(row, i) for i in range(count)}
        return {i: Prompt(r) for i, r in self.prompts_for(getattr(row, "speaker", None), count, row.id).items()}

    def prompts_for(self, speaker: str | None, count: int, avoid: str | None = None) -> dict[int, object]:
        """Speaker -> a row of the corpus whose clip is a prompt of the voice ``speaker`` (a speaker column)
        names for it; never the row ``avoid``."""
        voices = voices_of(speaker)
        if self.corpus is None or len(voices) != count:
            return {}
        chosen = {}
        for i, voice in enumerate(voices):
            others = [r for r in self.corpus.get(voice, []) if r.id != avoid]
            if others:
                pick = others[int(_unit(self.seed, avoid, i) * len(others))]
                chosen[i] = pick
        return chosen

    def prompt_ids(self, turns: Sequence[Turn], latents: dict[int, int]) -> list[int]:
        """Token ids up to the target's ``<|vision_start|>``; ``latents``: speaker -> latents of its prompt, to
        which the prompt's pad is expanded."""
        ids = self.tokenizer(render(turns, sorted(latents)), add_special_tokens=False)["input_ids"]
        pad, runs, expanded = self.ids["pad"], iter(latents[i] for i in sorted(latents)), []
        for token in ids:
            expanded += [pad] * next(runs) if token == pad else [token]
        return expanded

    def make(self, row) -> dict[str, np.ndarray]:
        """One example: ``input_ids`` int64 [L], ``labels`` int64 [L] (-100 but on the target span), ``clips``
        (the prompts', then the target's: samples, or features [T, D]), ``is_target`` bool per clip, ``clip_keys``
        (their rows' keys in the encoders' cache: :func:`clip_key`)."""
        turns, labels = parse_script(row.text)
        target = self.clip(row.codes)
        chosen = self.prompts(row, len(labels))
        prompts = {i: self.clip(p.stored()) for i, p in chosen.items()}
        clips = [prompts[i] for i in sorted(prompts)]
        expanded = self.prompt_ids(turns, {i: self.count(c) for i, c in prompts.items()})
        pad = self.ids["pad"]
        start = len(expanded) - 1  # the target's <|vision_start|>: its output is the first audio token
        expanded += [pad] * self.count(target) + [self.ids["end"], self.ids["eos"]]
        input_ids = np.asarray(expanded, dtype=np.int64)
        targets = np.full_like(input_ids, -100)
        targets[start:-1] = input_ids[start + 1:]
        keys = [chosen[i].key for i in sorted(chosen)] + [clip_key(row.id)]
        return {"input_ids": input_ids, "labels": targets, "clips": [*clips, target],
                "is_target": np.asarray([False] * len(clips) + [True]), "clip_keys": np.asarray(keys, dtype=np.int64)}

    def length(self, row) -> int:
        """Tokens of the example of ``row`` (text + prompt latents + target latents)."""
        if self.tokenizer is None:
            raise ModelLoadError("the tokenizer of model.init_from is not at hand (a hub id not downloaded): pass "
                                 "`voxrelay plan --seq-len N`, or set model.init_from / model.tokenizer to a folder")
        turns, labels = parse_script(row.text)  # the example's size without reading its audio
        sizes = {i: self.latents(p.size()) for i, p in self.prompts(row, len(labels)).items()}
        return len(self.prompt_ids(turns, sizes)) + self.latents(num_frames(row)) + 2  # + end of speech, of text


def collate(examples: list[dict], pad_id: int, hop: int, draws: int) -> dict[str, torch.Tensor]:
    """Right-pad ids (``pad_id``, attention 0, labels -100) and clips (zeros; ``audio_len`` keeps each length in
    samples), with the loss counts: ``ce`` = label positions, ``diffusion`` = target latents x ``draws`` noise
    draws. Clips of stored features ([T, D]) make ``audio`` [A, T, D], their lengths T x ``hop``."""
    width = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(examples), width), dtype=torch.int64)
    labels = torch.full((len(examples), width), -100, dtype=torch.int64)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[i, :n], mask[i, :n], labels[i, :n] = torch.from_numpy(e["input_ids"]), 1, torch.from_numpy(e["labels"])
    clips = [np.asarray(c, dtype=np.float32) for e in examples for c in e["clips"]]
    if clips[0].ndim == 2:  # features: latents [T, D]
        audio = torch.zeros((len(clips), max(len(c) for c in clips), clips[0].shape[1]), dtype=torch.float32)
        lengths = torch.tensor([len(c) * hop for c in clips], dtype=torch.int64)
    else:
        longest = -(-max(len(c) for c in clips) // hop) * hop  # whole latents, as the feature extractor pads
        audio = torch.zeros((len(clips), longest), dtype=torch.float32)
        lengths = torch.tensor([len(c) for c in clips], dtype=torch.int64)
    for j, c in enumerate(clips):
        audio[j, : len(c)] = torch.from_numpy(c)
    is_target = torch.from_numpy(np.concatenate([e["is_target"] for e in examples]))
    keys = torch.from_numpy(np.concatenate([e["clip_keys"] for e in examples]))
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels, "audio": audio, "audio_len": lengths,
             "audio_key": keys, "audio_is_target": is_target}
    latents = int(((lengths[is_target] + hop - 1) // hop).sum())
    return with_counts(batch, {"ce": (labels != -100).sum(), "diffusion": torch.tensor(latents * draws)})


def clip_key(row_id: str) -> int:
    """A clip's key in the encoders' cache: a 63-bit number of its row id (the same in every process and run)."""
    return int.from_bytes(hashlib.sha256(row_id.encode()).digest()[:8], "big") >> 1
