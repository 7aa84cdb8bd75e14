"""The ``causal_lm`` family: a transformers causal LM over codec codes, every sequence laid out by a declared
:class:`~voxrelay.models.causal_lm.layout.Layout` (resolved against the tokenizer as a
:class:`~voxrelay.models.causal_lm.tokens.TokenMap`).

Batches are right-padded with the layout's pad id (attention mask 0, label -100 there) or packed. A saved folder is
an HF folder upstream code loads as is (``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``), with the
layout itself in ``voxrelay.json`` (written last), so a model never depends on the layout file it was built from.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from voxrelay.models.base import (
    Example,
    LoraDefaults,
    LossTerm,
    LossTerms,
    Request,
    Row,
    Speech,
    decay_groups,
    num_frames,
    speak_codes,
    with_counts,
)
from voxrelay.models.causal_lm import tokens as T
from voxrelay.models.causal_lm.layout import Layout, from_dict
from voxrelay.models.hf import load_causal_lm, read_meta, write_meta
from voxrelay.models.linear_ce import causal_lm_hidden, chunkable, head_loss
from voxrelay.models.packing import model_inputs, pack
from voxrelay.models.sampling import sample, sample_processed
from voxrelay.models.seam import FamilyModelBase

FORMAT_VERSION = 1
IGNORE_INDEX = -100
LAYOUT_DEFAULT: Any = "layout default"  # a sampling option left out of speak/generate: the layout's (None: off)


class Sampling(NamedTuple):
    """How one token is drawn: temperature and top-k alone draw as every family does (:func:`sample`); with a
    top-p or a repetition penalty, as transformers' generate (:func:`sample_processed`)."""

    temperature: float
    top_k: int | None
    top_p: float | None
    repetition_penalty: float | None

    def pick(self, logits: torch.Tensor, seen: torch.Tensor, generator: torch.Generator) -> int:
        """An index into ``logits`` [N]; ``seen``: the indices already in the sequence."""
        if (self.top_p is None or self.top_p >= 1.0) and self.repetition_penalty in (None, 1.0):
            return sample(logits, self.temperature, self.top_k, generator)
        return sample_processed(logits, self.temperature, self.top_k, self.top_p, self.repetition_penalty, seen,
                                generator)


class LayoutLM(FamilyModelBase):
    """A :class:`~voxrelay.models.base.FamilyModel` of the ``causal_lm`` family: ``module`` a transformers causal
    LM, ``tokenizer`` with the layout's tokens, ``speakers`` the data's voices (in the text when the layout has a
    ``speaker_format``)."""

    request_fields: tuple[str, ...] = ()  # text and speaker only
    sampling_options: tuple[str, ...] = ("top_p", "repetition_penalty")  # defaults: the layout's
    family = "causal_lm"
    packing_refusal = None  # collate_packed
    chunked_heads = True  # its loss goes through head_loss (train.chunked_loss)
    max_length_key = "model.max_seq_len"

    def __init__(self, module: Any, tokenizer: Any, layout: Layout, speakers: list[str], max_seq_len: int,
                 loss_on: str, drop_repeated: bool) -> None:
        self.module = module
        self.tokenizer = tokenizer
        self.layout = layout
        self.speakers = speakers
        self.max_length = max_seq_len
        self.loss_on = loss_on
        self.drop_repeated = drop_repeated  # training examples only

    @functools.cached_property
    def ids(self) -> T.TokenMap:
        """The layout's ids in this tokenizer (resolved when first needed: a plan without a tokenizer needs none)."""
        return T.resolve(self.layout, self.tokenizer)

    # ---------------------------------------------------------------- sequences

    def prompt_text(self, text: str, speaker: str | None) -> str:
        """The text as the layout gives it to the model: as phonemes (``phonemize``), with a speaker
        (``speaker_format``); a model trained on known speakers refuses others, one trained without any accepts
        any name."""
        if (how := self.layout.phonemize) is not None:
            from voxrelay.models.causal_lm.phonemes import phonemes

            text = phonemes(text, how.language, how.preserve_punctuation, how.with_stress)
        fmt = self.layout.speaker_format
        if speaker is None or fmt is None:
            return text
        if self.speakers and speaker not in self.speakers:
            shown = ", ".join(repr(s) for s in self.speakers[:10])
            raise T.LayoutPromptError(f"unknown voice {speaker!r}; this model knows {len(self.speakers)}: {shown}")
        return fmt.format(speaker=speaker, text=text)

    def prompt_ids(self, text: str, speaker: str | None = None) -> list[int]:
        """The layout's prompt with the text's ids (tokenized on its own, no special tokens added)."""
        return self.ids.prompt_ids(self.tokenizer.encode(self.prompt_text(text, speaker), add_special_tokens=False))

    def length(self, row: Row) -> int:
        """Tokens of the row's example, before repeated frames are dropped (the plan reads no codes: a bound)."""
        return (len(self.prompt_ids(row.text, row.speaker)) + self.layout.codebooks * num_frames(row)
                + len(self.ids.after_audio))

    def example(self, row: Row) -> Example:
        """``input_ids`` int64 [L] = prompt + audio ids + the tokens after the audio; ``labels`` int64 [L]: equal to
        ``input_ids`` (loss_on=all) or -100 on the prompt but its ``labelled_prompt_tail`` (loss_on=speech)."""
        prompt = self.prompt_ids(row.text, row.speaker)
        codes = T.drop_repeated_frames(row.codes) if self.drop_repeated else row.codes
        ids = np.concatenate([np.asarray(prompt, dtype=np.int64), self.ids.codes_to_ids(codes),
                              np.asarray(self.ids.after_audio, dtype=np.int64)])
        labels = ids.copy()
        if self.loss_on == "speech":
            labels[: len(prompt) - self.layout.labelled_prompt_tail] = IGNORE_INDEX
        return {"input_ids": ids, "labels": labels}

    def collate(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """Right-pad into ``input_ids``/``attention_mask``/``labels`` int64 [B, Lmax] (the layout's pad, mask 0,
        label -100 on padding) + the counts of the loss terms: ``ce``, the labelled positions after the causal
        shift, and ``speech``, those of them whose target is an audio id."""
        if not examples:
            raise ValueError("collate needs at least one example")
        lmax = max(len(e["input_ids"]) for e in examples)
        input_ids = torch.full((len(examples), lmax), self.ids.pad, dtype=torch.long)
        labels = torch.full((len(examples), lmax), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(examples), lmax), dtype=torch.long)
        for i, e in enumerate(examples):
            n = len(e["input_ids"])
            input_ids[i, :n] = torch.as_tensor(e["input_ids"])
            labels[i, :n] = torch.as_tensor(e["labels"])
            mask[i, :n] = 1
        return self._with_counts({"input_ids": input_ids, "attention_mask": mask, "labels": labels})

    def collate_packed(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """:meth:`collate`'s examples end to end in one row [1, N], positions from 0 in each; the same counts."""
        return self._with_counts(pack(examples))

    def loss(self, module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossTerms:
        """``ce``: the summed next-token cross-entropy over labelled positions (float32 softmax over only those
        rows of the logits) and their count; ``speech``: its part over audio-id targets, weight 0 (monitored)."""
        inputs = model_inputs(batch)
        targets = batch["labels"][:, 1:]
        keep = targets != IGNORE_INDEX
        kept = targets[keep]
        speech = self._is_speech(kept)
        if chunkable(self.loss_kernel, self.module.get_output_embeddings()):  # train.chunked_loss: no logits
            hidden = causal_lm_hidden(module, **inputs)[:, :-1][keep]
            ce = head_loss(hidden, self.module.get_output_embeddings(), kept, self.loss_kernel,
                           self.loss_chunk_tokens, speech)
            return {"ce": LossTerm(ce.total, keep.sum()), "speech": LossTerm(ce.split, speech.sum(), 0.0)}
        out = module(**inputs, use_cache=False)
        losses = F.cross_entropy(out.logits[:, :-1][keep].float(), kept, reduction="none")
        return {"ce": LossTerm(losses.sum(), keep.sum()),
                "speech": LossTerm(losses.detach()[speech].sum(), speech.sum(), 0.0)}

    def _with_counts(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        targets = batch["labels"][:, 1:]
        return with_counts(batch, {"ce": (targets != IGNORE_INDEX).sum(), "speech": self._is_speech(targets).sum()})

    def _is_speech(self, targets: torch.Tensor) -> torch.Tensor:
        """Which targets are audio ids (not text, special tokens or padding)."""
        return (targets >= self.ids.audio_start) & (targets < self.ids.audio_end)

    # ---------------------------------------------------------------- optimisation and strategies

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        return decay_groups(self.module, weight_decay)

    def lora_defaults(self) -> LoraDefaults:
        """The layout's upstream LoRA; the embedding rows the build added train too (``train.lora.embeddings``)."""
        hint = self.layout.lora
        return LoraDefaults(r=hint.r, alpha=hint.alpha, dropout=hint.dropout, rslora=hint.rslora,
                            target_modules=list(hint.target_modules), modules_to_save=[],
                            embeddings=["lm_head", "embed_tokens"])

    # ---------------------------------------------------------------- synthesis

    def speak(self, request: Request, codec, max_frames: int | None = None, temperature: float = 0.8,
              top_k: int | None = 50, seed: int = 0, top_p: float | None = LAYOUT_DEFAULT,
              repetition_penalty: float | None = LAYOUT_DEFAULT) -> Speech:
        """:meth:`generate` the request's text and speaker, decoded by ``codec``."""
        return speak_codes(self, request, codec, max_frames, temperature, top_k, seed, top_p=top_p,
                           repetition_penalty=repetition_penalty)

    @torch.no_grad()
    def generate(self, text: str, speaker: str | None = None, max_frames: int | None = None,
                 temperature: float = 0.8, top_k: int | None = 50, seed: int = 0,
                 top_p: float | None = LAYOUT_DEFAULT, repetition_penalty: float | None = LAYOUT_DEFAULT) -> np.ndarray:
        """Codes int64 [K, T] for ``text``, deterministic for a ``seed``; ``temperature <= 0`` is greedy. Each
        position of a frame samples among its codebook's ids only (the stop token too at a frame boundary after
        one frame); ``top_p`` / ``repetition_penalty`` left out: the layout's (upstream's) defaults, None: off."""
        prompt = self.prompt_ids(text, speaker)
        k = self.layout.codebooks
        budget = (self.max_length - len(prompt) - 1) // k
        if budget < 1:
            raise T.LayoutPromptError(f"the prompt of {text[:40]!r} takes {len(prompt)} tokens, leaving no room for "
                                      f"one frame in model.max_seq_len={self.max_length}; shorten the text")
        max_frames = budget if max_frames is None else max(1, min(max_frames, budget))
        hint = self.layout.sampling
        how = Sampling(temperature, top_k, hint.top_p if top_p is LAYOUT_DEFAULT else top_p,
                       hint.repetition_penalty if repetition_penalty is LAYOUT_DEFAULT else repetition_penalty)
        was_training = self.module.training
        self.module.eval()
        try:
            ids = self._decode(prompt, max_frames, how, seed)
        finally:
            self.module.train(was_training)
        return self.ids.ids_to_codes(np.asarray(prompt + ids, dtype=np.int64))

    def _decode(self, prompt: list[int], max_frames: int, how: Sampling, seed: int) -> list[int]:
        """KV-cached sampling; returns the generated ids (audio ids, then the stop id if it ended)."""
        device = next(self.module.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        step_input, past, out_ids = torch.tensor([prompt], device=device), None, []
        seen = torch.tensor(prompt, device=device)  # every id so far: what the repetition penalty looks at
        k, size, stop = self.layout.codebooks, self.layout.codebook_size, self.ids.stop
        while len(out_ids) < max_frames * k:
            out = self.module(input_ids=step_input, past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1].float()
            position = len(out_ids) % k
            lo = int(self.ids.offsets[position])
            ids = torch.arange(lo, lo + size, device=device)  # the candidates' ids
            if position == 0 and out_ids:  # the stop token is a candidate too
                ids = torch.cat([ids, torch.tensor([stop], device=device)])
            choice = how.pick(logits[ids], torch.isin(ids, seen).nonzero()[:, 0], generator)
            if int(ids[choice]) == stop:
                return [*out_ids, stop]
            out_ids.append(lo + choice)
            step_input = torch.tensor([[lo + choice]], device=device)
            seen = torch.cat([seen, step_input[0]])
        return out_ids

    # ---------------------------------------------------------------- files

    def meta(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "family": self.family, "speakers": list(self.speakers),
                "max_seq_len": self.max_length, "loss_on": self.loss_on, "drop_repeated_frames": self.drop_repeated,
                "layout": self.layout.model_dump(mode="json")}

    def save_pretrained(self, folder: str | os.PathLike[str]) -> None:
        """HF folder (weights, config.json, generation_config.json, tokenizer at the root) + ``voxrelay.json``
        (with the layout) last."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        gen = getattr(self.module, "generation_config", None)
        if gen is not None:  # what upstream inference stops and pads on
            gen.eos_token_id, gen.pad_token_id = self.ids.stop, self.ids.pad
            if self.ids.bos is not None:
                gen.bos_token_id = self.ids.bos
        self.module.save_pretrained(str(folder))
        self.tokenizer.save_pretrained(str(folder))
        write_meta(folder, self.meta())

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str]) -> LayoutLM:
        """Load a folder written by :meth:`save_pretrained` (no network access)."""
        from voxrelay.models.causal_lm.loading import load_tokenizer

        folder = Path(folder)
        meta = read_meta(folder, cls.family, FORMAT_VERSION)
        layout = from_dict(meta["layout"], f"{folder}/voxrelay.json layout")
        module = load_causal_lm(str(folder), f"model folder {str(folder)!r}", attn_implementation="sdpa")
        tokenizer = load_tokenizer(str(folder), f"model folder {str(folder)!r}", layout)
        return cls(module, tokenizer, layout, list(meta["speakers"]), int(meta["max_seq_len"]), meta["loss_on"],
                   bool(meta["drop_repeated_frames"]))
