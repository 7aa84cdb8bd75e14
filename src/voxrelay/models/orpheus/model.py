"""The ``orpheus`` family: Orpheus-TTS' exact sequence layout (see :mod:`.layout`) on a Llama-3 causal LM.

Upstream fine-tuning runs batch 1 with no padding; here batches of any size are right-padded with the pad
id 128263, attention mask 0 and label -100 there. The loss covers the whole sequence (upstream) or only the
speech (``model.loss_on``). A saved folder is an HF folder upstream code loads as is: ``config.json`` +
``model.safetensors`` (``LlamaForCausalLM.from_pretrained``), the tokenizer with Orpheus' custom tokens at
the folder's root (``AutoTokenizer.from_pretrained``), and ``voxrelay.json`` written last.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from voxrelay.errors import UserError
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
from voxrelay.models.hf import load_causal_lm, read_meta, write_meta
from voxrelay.models.linear_ce import causal_lm_hidden, chunkable, head_loss
from voxrelay.models.orpheus import layout as L
from voxrelay.models.orpheus.loading import load_tokenizer
from voxrelay.models.packing import model_inputs, pack
from voxrelay.models.sampling import sample, sample_processed
from voxrelay.models.seam import FamilyModelBase

FORMAT_VERSION = 1
# upstream's inference of a fine-tuned model with transformers' generate (the fine-tuning notebook Orpheus' README
# links, unslothai/notebooks Orpheus_(3B)-TTS: temperature 0.6, top_p 0.95, repetition_penalty 1.1; its README:
# "repetition_penalty>=1.1 is required for stable generations"; the vLLM package's engine_class.py serves with
# 0.8 and 1.3): top-p and the penalty are Orpheus' defaults here (temperature and top-k: voxrelay's)
TOP_P = 0.95
REPETITION_PENALTY = 1.1
IGNORE_INDEX = -100
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SPEECH_LABELS = (L.END_OF_SPEECH, L.END_OF_AI)  # besides the audio ids, what loss_on=speech learns


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


class OrpheusPromptError(UserError, ValueError):
    """A text (or voice) that cannot be turned into an Orpheus prompt."""


class Orpheus(FamilyModelBase):
    """A :class:`~voxrelay.models.base.FamilyModel` of the ``orpheus`` family.

    ``module``: a ``LlamaForCausalLM`` with 156,940 embedding rows; ``tokenizer``: the Llama-3 tokenizer with
    Orpheus' custom tokens; ``speakers``: voices of the training data (the prompt is ``"{speaker}: {text}"``).
    """

    request_fields: tuple[str, ...] = ()  # text and speaker only
    sampling_options: tuple[str, ...] = ("top_p", "repetition_penalty")  # defaults: upstream's (TOP_P ...)

    family = "orpheus"
    packing_refusal = None  # collate_packed
    chunked_heads = True  # its loss goes through head_loss (train.chunked_loss)
    max_length_key = "model.max_seq_len"

    def __init__(self, module: Any, tokenizer: Any, speakers: list[str], max_seq_len: int, loss_on: str,
                 drop_duplicates: bool = True) -> None:
        self.module = module
        self.tokenizer = tokenizer
        self.speakers = speakers
        self.max_length = max_seq_len
        self.loss_on = loss_on
        self.drop_duplicates = drop_duplicates  # model.drop_duplicate_frames (training examples only)

    # ---------------------------------------------------------------- sequences

    def prompt_text(self, text: str, speaker: str | None) -> str:
        """``"{speaker}: {text}"`` (upstream multi-speaker format), or ``text``. Emotive tags (``<laugh>``,
        ``<sigh>`` ...) are plain text to the tokenizer, as upstream. A model trained on known speakers refuses
        others; one trained without speakers accepts any name (e.g. the voices of an Orpheus fine-tune)."""
        if speaker is None:
            return text
        if self.speakers and speaker not in self.speakers:
            shown = ", ".join(repr(s) for s in self.speakers[:10])
            raise OrpheusPromptError(f"unknown voice {speaker!r}; this model knows {len(self.speakers)}: {shown}")
        return f"{speaker}: {text}"

    def prompt_ids(self, text: str, speaker: str | None = None) -> list[int]:
        """``[128259, BOS, text ids, 128009, 128260, 128261, 128257]`` (upstream's training prefix and
        inference prompt)."""
        return L.prompt_ids(self.tokenizer.encode(self.prompt_text(text, speaker), add_special_tokens=False))

    def length(self, row: Row) -> int:
        """Tokens of the row's example, before duplicate frames are dropped (the plan reads no codes: a bound)."""
        return len(self.prompt_ids(row.text, row.speaker)) + L.CODES_PER_FRAME * num_frames(row) + 2

    def example(self, row: Row) -> Example:
        """``input_ids`` int64 [L] = prompt + audio ids + [128258, 128262]; ``labels`` int64 [L]: equal to
        ``input_ids`` (loss_on=all) or -100 outside the audio ids and the two end ids (loss_on=speech). With
        ``drop_duplicates`` a frame whose c0 repeats the previous frame's is left out (upstream's preparation)."""
        prompt = self.prompt_ids(row.text, row.speaker)
        codes = L.drop_duplicate_frames(row.codes) if self.drop_duplicates else row.codes
        ids = np.concatenate([np.asarray(prompt, dtype=np.int64), L.codes_to_ids(codes),
                              np.asarray([L.END_OF_SPEECH, L.END_OF_AI], dtype=np.int64)])
        labels = ids.copy()
        if self.loss_on == "speech":
            labels[: len(prompt)] = IGNORE_INDEX
        return {"input_ids": ids, "labels": labels}

    def collate(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """Right-pad into ``input_ids``/``attention_mask``/``labels`` int64 [B, Lmax] (pad 128263, mask 0,
        label -100 on padding) + the counts of the loss terms: ``ce``, the labelled positions after the causal
        shift, and ``speech``, those of them whose target is an audio code."""
        if not examples:
            raise ValueError("collate needs at least one example")
        lmax = max(len(e["input_ids"]) for e in examples)
        input_ids = torch.full((len(examples), lmax), L.PAD, dtype=torch.long)
        labels = torch.full((len(examples), lmax), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(examples), lmax), dtype=torch.long)
        for i, e in enumerate(examples):
            n = len(e["input_ids"])
            input_ids[i, :n] = torch.as_tensor(e["input_ids"])
            labels[i, :n] = torch.as_tensor(e["labels"])
            mask[i, :n] = 1
        return _with_counts({"input_ids": input_ids, "attention_mask": mask, "labels": labels})

    def collate_packed(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """:meth:`collate`'s examples end to end in one row [1, N], positions from 0 in each; the same counts."""
        return _with_counts(pack(examples))

    def loss(self, module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossTerms:
        """``ce``: the summed next-token cross-entropy over labelled positions (float32 softmax over only those
        rows of the 156,940-way logits) and their count; ``speech``: its part over audio-code targets, weight 0
        (monitored: is the model learning the audio, not only the text it is also trained on?)."""
        inputs = model_inputs(batch)
        targets = batch["labels"][:, 1:]
        keep = targets != IGNORE_INDEX
        kept = targets[keep]
        speech = _is_speech(kept)
        if chunkable(self.loss_kernel, self.module.get_output_embeddings()):  # train.chunked_loss: no logits
            hidden = causal_lm_hidden(module, **inputs)[:, :-1][keep]
            ce = head_loss(hidden, self.module.get_output_embeddings(), kept, self.loss_kernel,
                           self.loss_chunk_tokens, speech)
            return {"ce": LossTerm(ce.total, keep.sum()), "speech": LossTerm(ce.split, speech.sum(), 0.0)}
        out = module(**inputs, use_cache=False)
        losses = F.cross_entropy(out.logits[:, :-1][keep].float(), kept, reduction="none")
        return {"ce": LossTerm(losses.sum(), keep.sum()),
                "speech": LossTerm(losses.detach()[speech].sum(), speech.sum(), 0.0)}

    # ---------------------------------------------------------------- optimisation and strategies

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        return decay_groups(self.module, weight_decay)

    def lora_defaults(self) -> LoraDefaults:
        """Upstream's LoRA (finetune/lora.py): r 32, alpha 64, rsLoRA, every projection. Upstream also trains
        lm_head and embed_tokens in full; an Orpheus checkpoint already holds the audio tokens, so only the rows
        a plain Llama-3 lacked train (``train.lora.embeddings``; ``full``: both in full, still tied)."""
        return LoraDefaults(r=32, alpha=64, dropout=0.0, rslora=True, target_modules=list(LORA_TARGETS),
                            modules_to_save=[], embeddings=["lm_head", "embed_tokens"])

    # ---------------------------------------------------------------- synthesis

    def speak(self, request: Request, codec, max_frames: int | None = None, temperature: float = 0.8,
              top_k: int | None = 50, seed: int = 0, top_p: float | None = TOP_P,
              repetition_penalty: float | None = REPETITION_PENALTY) -> Speech:
        """:meth:`generate` the request's text and speaker, decoded by ``codec`` (no description, no voice prompts)."""
        return speak_codes(self, request, codec, max_frames, temperature, top_k, seed, top_p=top_p,
                           repetition_penalty=repetition_penalty)

    @torch.no_grad()
    def generate(self, text: str, speaker: str | None = None, max_frames: int | None = None,
                 temperature: float = 0.8, top_k: int | None = 50, seed: int = 0, top_p: float | None = TOP_P,
                 repetition_penalty: float | None = REPETITION_PENALTY) -> np.ndarray:
        """SNAC codes int64 [7, T] for ``text``, deterministic for a ``seed``; ``temperature <= 0`` is greedy.

        Sampling is restricted to the ids upstream decoding would keep (position k of a frame: its 4,096
        audio ids; end_of_speech only at a frame boundary after one frame), then processed as transformers'
        generate does (repetition penalty over the prompt and what was generated, temperature, top-k, top-p;
        upstream's defaults, see :data:`TOP_P`), then decoded as upstream."""
        prompt = self.prompt_ids(text, speaker)
        budget = (self.max_length - len(prompt) - 1) // L.CODES_PER_FRAME
        if budget < 1:
            raise OrpheusPromptError(f"the prompt of {text[:40]!r} takes {len(prompt)} tokens, leaving no room for "
                                     f"one frame in model.max_seq_len={self.max_length}; shorten the text")
        max_frames = budget if max_frames is None else max(1, min(max_frames, budget))
        was_training = self.module.training
        self.module.eval()
        try:
            ids = self._decode(prompt, max_frames, Sampling(temperature, top_k, top_p, repetition_penalty), seed)
        finally:
            self.module.train(was_training)
        return L.ids_to_codes(np.asarray(prompt + ids, dtype=np.int64))

    def _decode(self, prompt: list[int], max_frames: int, how: Sampling, seed: int) -> list[int]:
        """KV-cached sampling; returns the generated ids (audio ids, then END_OF_SPEECH if it ended)."""
        device = next(self.module.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        step_input, past, out_ids = torch.tensor([prompt], device=device), None, []
        seen = torch.tensor(prompt, device=device)  # every id so far: what the repetition penalty looks at
        while len(out_ids) < max_frames * L.CODES_PER_FRAME:
            out = self.module(input_ids=step_input, past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1].float()
            k = len(out_ids) % L.CODES_PER_FRAME
            lo = int(L.OFFSETS[k])
            ids = torch.arange(lo, lo + L.CODEBOOK_SIZE, device=device)  # the candidates' ids
            if k == 0 and out_ids:  # end_of_speech is a candidate too
                ids = torch.cat([ids, torch.tensor([L.END_OF_SPEECH], device=device)])
            choice = how.pick(logits[ids], torch.isin(ids, seen).nonzero()[:, 0], generator)
            if int(ids[choice]) == L.END_OF_SPEECH:
                return [*out_ids, L.END_OF_SPEECH]
            out_ids.append(lo + choice)
            step_input = torch.tensor([[lo + choice]], device=device)
            seen = torch.cat([seen, step_input[0]])
        return out_ids

    # ---------------------------------------------------------------- files

    def save_pretrained(self, folder: str | os.PathLike[str]) -> None:
        """HF folder (weights, config.json, generation_config.json, tokenizer at the root) + ``voxrelay.json``
        last."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        gen = getattr(self.module, "generation_config", None)
        if gen is not None:  # what upstream inference stops and pads on
            gen.eos_token_id, gen.pad_token_id, gen.bos_token_id = L.END_OF_SPEECH, L.PAD, L.BOS
        self.module.save_pretrained(str(folder))
        self.tokenizer.save_pretrained(str(folder))
        meta = {"format_version": FORMAT_VERSION, "family": self.family, "speakers": list(self.speakers),
                "max_seq_len": self.max_length, "loss_on": self.loss_on}
        write_meta(folder, meta)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str]) -> Orpheus:
        """Load a folder written by :meth:`save_pretrained` (no network access)."""
        folder = Path(folder)
        meta = read_meta(folder, "orpheus", FORMAT_VERSION)
        module = load_causal_lm(str(folder), f"model folder {str(folder)!r}", attn_implementation="sdpa")
        tokenizer = load_tokenizer(str(folder), f"model folder {str(folder)!r}")
        return cls(module, tokenizer, list(meta["speakers"]), int(meta["max_seq_len"]), meta["loss_on"])


def _with_counts(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``batch`` with the counts of its loss terms: ``ce``, the labelled positions after the causal shift, and
    ``speech``, those of them whose target is an audio code."""
    targets = batch["labels"][:, 1:]
    return with_counts(batch, {"ce": (targets != IGNORE_INDEX).sum(), "speech": _is_speech(targets).sum()})


def _is_speech(targets: torch.Tensor) -> torch.Tensor:
    """Which targets are audio codes (not text, special tokens or padding)."""
    return (targets >= L.AUDIO_START) & (targets < L.AUDIO_END_ID)
