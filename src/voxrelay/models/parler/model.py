"""The ``parler`` family's model: a :class:`~voxrelay.models.base.FamilyModel` over :class:`ParlerModule`.

An example is the row's description ids (T5 tokenizer, right-padded in a batch), its transcript ids (the
prompt tokenizer, left-padded as upstream trains) and its DAC codes in Parler's delay pattern as labels
``[K, T + K]``. The loss has one term per codebook, ``codebook_<k>``: its cross-entropy summed over its
targets (only the first EOS of a row is one), weighted ``1/K`` (or by ``model.codebook_weights``), so the
objective is upstream's mean of the per-codebook means.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voxrelay.errors import UserError
from voxrelay.models.base import (
    Example,
    LoraDefaults,
    LossTerm,
    LossTerms,
    Request,
    RequestError,
    Row,
    Speech,
    check_request,
    decay_groups,
    num_frames,
    with_counts,
)
from voxrelay.models.parler import delay
from voxrelay.models.parler.modeling import ParlerDecoderLayer, ParlerModule
from voxrelay.models.seam import FamilyModelBase


class DescriptionMissingError(RequestError, UserError):
    """Parler speaks from a description: a request without one."""


@dataclass(frozen=True)
class ParlerSettings:
    """What the model needs beside its weights and tokenizers (saved in ``voxrelay.json``)."""

    max_description_tokens: int = 256
    max_prompt_tokens: int = 600
    codebook_weights: tuple[float, ...] | None = None


class Parler(FamilyModelBase):
    """Parler-TTS: ``module`` (T5 + decoder), the two tokenizers, the data's speakers (descriptions carry
    the voice: speakers are informational) and :class:`ParlerSettings`."""

    family = "parler"
    packing_refusal = ("each example's decoder cross-attends to its own description's T5 states and the codebooks "
                       "follow the delay pattern per example; batches stay padded, bucketed by length")
    request_fields: tuple[str, ...] = ("description",)
    max_length_key = "model.max_position_embeddings"

    def __init__(self, module: ParlerModule, description_tokenizer: Any, prompt_tokenizer: Any,
                 speakers: list[str], settings: ParlerSettings, base_source: str | None = None):
        self.module = module
        self.description_tokenizer = description_tokenizer
        self.prompt_tokenizer = prompt_tokenizer
        self.speakers = speakers
        self.settings = settings
        self.base_source = base_source  # model.init_from: the base an adapter-only export names

    @property
    def config(self):
        """The module's :class:`~voxrelay.models.parler.modeling.ParlerConfig` (through any wrapper)."""
        module = self.module.get_base_model() if hasattr(self.module, "get_base_model") else self.module
        return module.config

    @property
    def max_length(self) -> int:
        return self.config.decoder.max_position_embeddings

    @property
    def num_codebooks(self) -> int:
        return self.config.decoder.num_codebooks

    @property
    def _special(self) -> tuple[int, int]:
        """(BOS, EOS = PAD) of the decoder: the codebook size + 1 and the codebook size."""
        return self.config.decoder.bos_token_id, self.config.decoder.eos_token_id

    # ---------------------------------------------------------------- examples

    def _description_ids(self, description: str | None, where: str) -> np.ndarray:
        if not description:
            raise DescriptionMissingError(f"{where} has no description; model.family=parler speaks from one "
                                          "(prepare: a description column or data.default_description; synthesize: "
                                          "--description; eval --texts: a JSONL file with description fields)")
        ids = self.description_tokenizer(description.strip())["input_ids"][: self.settings.max_description_tokens]
        return np.asarray(ids, dtype=np.int64)

    def _prompt_ids(self, text: str) -> np.ndarray:
        return np.asarray(self.prompt_tokenizer(text.strip())["input_ids"], dtype=np.int64)

    def length(self, row: Row) -> int:
        """Decoder positions: transcript tokens + frames + K (the delay pattern's tail)."""
        return len(self._prompt_ids(row.text)) + num_frames(row) + self.num_codebooks

    def example(self, row: Row) -> Example:
        codes = torch.as_tensor(np.asarray(row.codes, dtype=np.int64))
        if codes.shape[0] != self.num_codebooks:
            raise ValueError(f"row {getattr(row, 'id', '?')}: {codes.shape[0]} codebooks, the model has "
                             f"{self.num_codebooks}; prepare with the model's DAC")
        return {"description_ids": self._description_ids(row.description, f"row {getattr(row, 'id', '?')}"),
                "prompt_ids": self._prompt_ids(row.text)[: self.settings.max_prompt_tokens],
                "labels": delay.delay_labels(codes, *self._special).numpy()}

    def collate(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """``description_ids``/``_mask`` [B, S] right-padded, ``prompt_ids``/``_mask`` [B, Lp] left-padded,
        ``labels`` [B, L, K] (-100 padding) and the count of each codebook's loss targets."""
        if not examples:
            raise ValueError("collate needs at least one example")
        pad = self.description_tokenizer.pad_token_id or 0
        desc, desc_mask = _pad([e["description_ids"] for e in examples], pad, left=False)
        prompt, prompt_mask = _pad([e["prompt_ids"] for e in examples], self.prompt_tokenizer.pad_token_id or 0,
                                   left=True)
        labels = delay.collate_labels([torch.as_tensor(e["labels"]) for e in examples])
        counts = (delay.loss_targets(labels, *self._special) != delay.IGNORE_INDEX).sum(dim=(0, 1))
        batch = {"description_ids": desc, "description_mask": desc_mask, "prompt_ids": prompt,
                 "prompt_mask": prompt_mask, "labels": labels}
        return with_counts(batch, {_term(k): counts[k] for k in range(self.num_codebooks)})

    def loss(self, module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossTerms:
        """One term per codebook (sum of cross-entropies, target count, weight ``1/K`` or the configured one)."""
        labels = batch["labels"]
        logits = module(delay.decoder_inputs(labels, *self._special), batch["description_ids"],
                        batch["description_mask"], batch["prompt_ids"], batch["prompt_mask"])
        sums, counts = delay.codebook_losses(logits, labels, *self._special)
        weights = self.term_weights()
        return {_term(k): LossTerm(sums[k], counts[k], weights[k]) for k in range(self.num_codebooks)}

    def term_weights(self) -> list[float]:
        given = self.settings.codebook_weights
        if given is None:
            return [1.0 / self.num_codebooks] * self.num_codebooks
        if len(given) != self.num_codebooks:
            raise ValueError(f"model.codebook_weights has {len(given)} weights for {self.num_codebooks} codebooks")
        return [w / sum(given) for w in given]

    # ---------------------------------------------------------------- optimisation and strategies

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        return decay_groups(self.module, weight_decay)

    def lora_defaults(self) -> LoraDefaults:
        """Adapters on the decoder's attention (self and cross) and MLP, never on the frozen T5."""
        targets = r".*decoder\.model\.decoder\.layers\.\d+\.((self_attn|encoder_attn)\.(q|k|v|out)_proj|fc1|fc2)"
        return LoraDefaults(r=16, alpha=32, dropout=0.05, rslora=False, target_modules=targets, modules_to_save=[])

    def plan_shape(self, lora_rank: int = 0):
        """The decoder as ``voxrelay plan`` prices it (:mod:`voxrelay.models.parler.plan`). The frozen T5 runs
        under no_grad (nothing saved); its weights count as parameters."""
        from voxrelay.models.parler.plan import plan_shape

        return plan_shape(self.config.decoder, self.module, lora_rank)

    def fsdp_layer_classes(self) -> tuple[type[torch.nn.Module], ...]:
        """Decoder layers and T5 blocks shard as their own units (a frozen T5 block holds no gradient)."""
        from transformers.models.t5.modeling_t5 import T5Block

        return (ParlerDecoderLayer, T5Block)

    # ---------------------------------------------------------------- synthesis

    @torch.no_grad()
    def speak(self, request: Request, codec, max_frames: int | None = None, temperature: float = 0.8,
              top_k: int | None = 50, seed: int = 0) -> Speech:
        """Sample DAC codes for the request's text and description (upstream's sampling and EOS rules), decoded
        by ``codec``; greedy when ``temperature <= 0``."""
        from voxrelay.models.parler.generation import SamplingConfig, generate

        check_request(self, request)
        module = self.module.get_base_model() if hasattr(self.module, "get_base_model") else self.module
        device = next(module.parameters()).device
        desc = torch.as_tensor(self._description_ids(request.description, "the request"), device=device)[None]
        prompt = torch.as_tensor(self._prompt_ids(request.text), device=device)[None]
        room = self.max_length - prompt.shape[1] + 1  # decoder columns the positions allow (start column included)
        columns = room if max_frames is None else min(room, max_frames + self.num_codebooks + 1)
        if columns < self.num_codebooks + 2:
            raise UserError(f"the transcript {request.text[:40]!r} takes {prompt.shape[1]} of the model's "
                            f"{self.max_length} positions, leaving no room for audio; shorten it")
        sampling = SamplingConfig(do_sample=temperature > 0, temperature=temperature if temperature > 0 else 1.0,
                                  top_k=top_k or None, max_length=columns, seed=seed)
        was_training = module.training
        module.eval()
        try:
            cond = module.encode(desc, torch.ones_like(desc), prompt, torch.ones_like(prompt))
            codes = generate(module, cond, sampling).codes[0]
        finally:
            module.train(was_training)
        frames = int(codes.shape[1])
        wav = codec.decode(codes.cpu().numpy()) if frames else np.zeros(0, dtype=np.float32)
        return Speech(np.asarray(wav, dtype=np.float32), int(codec.sample_rate), frames)

    # ---------------------------------------------------------------- files

    def save_as(self, fmt: str, folder: str | os.PathLike[str], codec) -> None:
        """``fmt`` "parler": a folder upstream's ``ParlerTTSForConditionalGeneration.from_pretrained`` loads."""
        from voxrelay.models.parler.export import save_upstream

        if fmt != "parler":
            super().save_as(fmt, folder, codec)
        save_upstream(self, Path(folder), codec)

    def save_pretrained(self, folder: str | os.PathLike[str]) -> None:
        """Upstream's layout (``config.json`` + ``model.safetensors`` with upstream's names, the codec
        excluded), the tokenizers in ``description_tokenizer/`` and ``prompt_tokenizer/``, ``voxrelay.json`` last."""
        from voxrelay.models.parler.loading import save_folder

        save_folder(self, Path(folder))


def _term(k: int) -> str:
    return f"codebook_{k}"


def _pad(rows: list[np.ndarray], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad int64 rows into [B, L] and their mask (1 = token), on the right or, with ``left``, on the left."""
    longest = max(len(r) for r in rows)
    ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row)
        span = slice(longest - n, longest) if left else slice(0, n)
        ids[i, span] = torch.as_tensor(row, dtype=torch.long)
        mask[i, span] = 1
    return ids, mask
