"""The codec LM: a decoder-only transformer over ``[BOS, text, AUDIO_START, codes..., AUDIO_END]``.

As in Orpheus, the audio codes of a frame are flattened codebook by codebook (frame 0: k = 0..K-1,
then frame 1, ...) and each codebook has its own id range (see :class:`VocabLayout`). The loss is
taken on audio ids and AUDIO_END only. With ``frames_per_position`` a position holds whole frames
instead of one code (:mod:`.grouped`). With known speakers the text is prefixed by the speaker
name as plain text (``"en-us+m3: Hello"``), which works with any text tokenizer.

A saved folder holds ``model.safetensors`` + ``config.json`` (``LlamaForCausalLM.from_pretrained``
loads it), ``tokenizer/`` and ``voxrelay.json`` (written last: the folder is usable once it exists).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM, PreTrainedModel

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
from voxrelay.models.codec_lm import code_vectors as code_vectors_lib
from voxrelay.models.codec_lm import grouped
from voxrelay.models.codec_lm.code_vectors import CodeVectorEmbedding
from voxrelay.models.codec_lm.config import CodecLMConfig
from voxrelay.models.codec_lm.loading import (
    FORMAT_VERSION,
    TOKENIZER_DIR,
    llama_config,
    load_causal_lm,
    load_init,
    meta_init,
    read_meta,
)
from voxrelay.models.codec_lm.tokenizer import TextTokenizer, load_saved_tokenizer, load_text_tokenizer
from voxrelay.models.codec_lm.vocab import VocabLayout
from voxrelay.models.hf import write_meta
from voxrelay.models.linear_ce import causal_lm_hidden, chunkable, head_loss
from voxrelay.models.packing import model_inputs, pack
from voxrelay.models.sampling import sample
from voxrelay.models.seam import FamilyModelBase

IGNORE_INDEX = -100
# Llama's projections: what LoRA adapts by default (attention and MLP of every layer)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class SequenceTooLongError(UserError, ValueError):
    """An utterance does not fit in ``model.max_seq_len`` tokens."""


class CodecLM(FamilyModelBase):
    """A causal LM over text + codec ids, with its tokenizer, id layout and known speakers
    (a :class:`~voxrelay.models.base.FamilyModel` of the ``codec_lm`` family).

    ``module`` is the ``transformers`` model (a ``LlamaForCausalLM`` when built from scratch);
    ``max_seq_len`` bounds training sequences and generation (text + audio ids).
    """

    request_fields: tuple[str, ...] = ()  # text and speaker only

    family = "codec_lm"
    packing_refusal = None  # collate_packed: one row per batch, positions per example (text scale included)
    max_length_key = "model.max_seq_len"  # the config key of max_length, named in warnings

    def __init__(
        self,
        module: PreTrainedModel,
        tokenizer: TextTokenizer,
        layout: VocabLayout,
        speakers: list[str],
        max_seq_len: int,
        text_position_scale: float | None = None,
        frames_per_position: int | None = None,
    ) -> None:
        self.module = module
        self.tokenizer = tokenizer
        self.layout = layout
        self.speakers = speakers
        self.max_seq_len = max_seq_len
        self.text_position_scale = text_position_scale
        self.frames_per_position = frames_per_position

    @property
    def max_length(self) -> int:
        return self.max_seq_len

    @property
    def chunked_heads(self) -> bool:  # type: ignore[override]
        """One position per frame: the head's loss goes through head_loss (train.chunked_loss); with
        frames_per_position each slot has its own softmax over part of the head (grouped.loss, materialised)."""
        return not self.frames_per_position

    # ---------------------------------------------------------------- construction and files

    @classmethod
    def build(
        cls,
        model_cfg: CodecLMConfig,
        num_codebooks: int,
        codebook_size: int,
        speakers: list[str],
        seed: int,
        meta: bool = False,
        code_vectors: np.ndarray | None = None,
    ) -> CodecLM:
        """A new model: random init seeded by ``seed``, or weights from ``model_cfg.init_from``.

        ``init_from`` may be a plain causal-LM folder / hub id (its embeddings are resized to add
        the special and audio ids; ``model.tokenizer`` must be that model's tokenizer) or a folder
        written by :meth:`save_pretrained` (fine-tuning a voxrelay model; its layout is kept).
        The global torch RNG is left untouched. ``meta=True``: the module is on the meta device
        (no weights read or initialised), for planning; it keeps free audio rows whatever
        ``audio_embedding`` says (their count differs by a few projection weights). ``code_vectors``:
        the codec's vectors [K, C, D] (``model.audio_embedding: codec`` needs them).
        """
        slots = num_codebooks * (model_cfg.frames_per_position or 1)  # audio id ranges: one per code of a position
        if meta:
            module, tokenizer, layout = meta_init(model_cfg, slots, codebook_size)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                if model_cfg.init_from:
                    module, tokenizer, layout = load_init(model_cfg, slots, codebook_size)
                else:
                    tokenizer = load_text_tokenizer(model_cfg.tokenizer)
                    layout = VocabLayout(tokenizer.vocab_size, slots, codebook_size)
                    module = LlamaForCausalLM._from_config(llama_config(model_cfg, layout), attn_implementation="sdpa")
                if model_cfg.audio_embedding == "codec":
                    code_vectors_lib.attach(module, code_vectors, slots, codebook_size, layout.audio_offset)
        if model_cfg.frames_per_position and not isinstance(module.get_input_embeddings(), CodeVectorEmbedding):
            grouped.enable(module)
        return cls(module, tokenizer, layout, list(speakers), model_cfg.max_seq_len, model_cfg.text_position_scale,
                   model_cfg.frames_per_position)

    def save_pretrained(self, folder: str | os.PathLike[str]) -> None:
        """Write weights + config.json, ``tokenizer/`` and, last, ``voxrelay.json`` into a local folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        embedding = self.module.get_input_embeddings()
        if isinstance(embedding, CodeVectorEmbedding):  # the folder holds the computed rows, a plain Llama
            self.module.set_input_embeddings(code_vectors_lib.plain_embedding(embedding))
            try:
                self.module.save_pretrained(str(folder))
            finally:
                self.module.set_input_embeddings(embedding)
        else:
            self.module.save_pretrained(str(folder))
        self.tokenizer.save(folder / TOKENIZER_DIR)
        meta = {
            "format_version": FORMAT_VERSION,
            "family": "codec_lm",
            "tokenizer": self.tokenizer.spec,
            "layout": self.layout.to_dict(),
            "speakers": list(self.speakers),
            "max_seq_len": self.max_seq_len,
            "text_position_scale": self.text_position_scale,
            "frames_per_position": self.frames_per_position,
        }
        write_meta(folder, meta)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str]) -> CodecLM:
        """Load a folder written by :meth:`save_pretrained` (no network access)."""
        folder = Path(folder)
        meta = read_meta(folder)
        layout = VocabLayout.from_dict(meta["layout"])
        tokenizer = load_saved_tokenizer(folder / TOKENIZER_DIR)
        module = load_causal_lm(str(folder), f"model folder {str(folder)!r}", attn_implementation="sdpa")
        if meta.get("frames_per_position"):
            grouped.enable(module)
        return cls(module, tokenizer, layout, list(meta["speakers"]), int(meta["max_seq_len"]),
                   meta.get("text_position_scale"), meta.get("frames_per_position"))

    # ---------------------------------------------------------------- training data (the seam)

    def length(self, row: Row) -> int:
        """Tokens of the training sequence of a prepared row (see :meth:`sequence_length`)."""
        return self.sequence_length(row.text, num_frames(row), row.speaker)

    def example(self, row: Row) -> Example:
        """The training example of a prepared row; codec_lm has no use for ``row.description``."""
        return self.encode_example(row.text, row.codes, row.speaker)

    def prompt_text(self, text: str, speaker: str | None) -> str:
        """The text the LM reads: ``"<speaker>: <text>"`` when the model knows speakers, else ``text``.

        A model built with no speakers ignores ``speaker`` (it has no speaker conditioning).
        """
        if not self.speakers or speaker is None:
            return text
        if speaker not in self.speakers:
            shown = ", ".join(repr(s) for s in self.speakers[:10])
            raise ValueError(f"unknown speaker {speaker!r}; this model knows {len(self.speakers)}: {shown}")
        return f"{speaker}: {text}"

    def _prompt_ids(self, text: str, speaker: str | None) -> list[int]:
        """``[BOS, text ids..., AUDIO_START]``."""
        text_ids = self.tokenizer.encode(self.prompt_text(text, speaker))
        return [self.layout.bos_id, *text_ids, self.layout.audio_start_id]

    def sequence_length(self, text: str, num_frames: int, speaker: str | None = None) -> int:
        """Tokens of the training sequence of an utterance (prompt + K * num_frames + AUDIO_END).

        Does not check ``max_seq_len``, so that a batch planner can filter long utterances.
        With ``frames_per_position`` G: prompt + ceil((num_frames + 1) / G), AUDIO_END in the last group.
        """
        return self._length(len(self._prompt_ids(text, speaker)), num_frames)

    def _length(self, prompt_length: int, num_frames: int) -> int:
        if self.frames_per_position:
            return prompt_length + -(-(num_frames + 1) // self.frames_per_position)
        return prompt_length + num_frames * self.layout.num_codebooks + 1

    def encode_example(self, text: str, codes: np.ndarray, speaker: str | None = None) -> dict[str, np.ndarray]:
        """text + codes int [K, T] -> ``input_ids`` int64 [L] and ``labels`` int64 [L].

        ``labels`` equal ``input_ids`` on audio ids and AUDIO_END, and -100 on BOS, text and
        AUDIO_START (no loss there). L = prompt length + K * T + 1.
        """
        prompt = self._prompt_ids(text, speaker)
        if self.frames_per_position:  # the codec's K books (the layout has K * G id ranges)
            codes = self.layout.check_codes(codes, self.layout.num_codebooks // self.frames_per_position)
        else:
            audio = self.layout.codes_to_ids(codes)
        length = self._length(len(prompt), np.asarray(codes).shape[1])
        if length > self.max_seq_len:
            raise SequenceTooLongError(
                f"utterance {text[:40]!r} ({np.asarray(codes).shape[1]} frames, {len(prompt) - 2} text tokens) "
                f"needs {length} tokens but model.max_seq_len is {self.max_seq_len}; raise model.max_seq_len "
                "or lower data.max_duration"
            )
        if self.frames_per_position:
            return grouped.encode_example(self, prompt, codes)
        input_ids = np.concatenate(
            [np.asarray(prompt, dtype=np.int64), audio, np.asarray([self.layout.audio_end_id], dtype=np.int64)]
        )
        labels = input_ids.copy()
        labels[: len(prompt)] = IGNORE_INDEX
        example = {"input_ids": input_ids, "labels": labels}
        if self.text_position_scale is not None:
            example["position_ids"] = np.concatenate([self._prompt_positions(len(prompt)),
                                                      self._audio_positions(0, audio.size + 1)])
        return example

    def _prompt_positions(self, length: int) -> np.ndarray:
        """Positions of ``[BOS, text..., AUDIO_START]`` with ``text_position_scale``: text id j (1-based)
        at round(j * scale); BOS and AUDIO_START at 0, so audio frame t (at t + 1) meets the text spoken then."""
        text = np.rint(np.arange(1, length - 1) * self.text_position_scale).astype(np.int64)
        return np.concatenate([[0], text, [0]])

    def _audio_positions(self, start: int, count: int) -> np.ndarray:
        """Positions of audio ids ``start .. start + count - 1`` (AUDIO_END counts as the next frame's first
        id): every id of frame t at t + 1."""
        return 1 + np.arange(start, start + count, dtype=np.int64) // self.layout.num_codebooks

    def collate(self, examples: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
        """Right-pad examples of :meth:`encode_example` into a batch.

        Returns ``input_ids`` int64 [B, Lmax] (PAD after the end), ``attention_mask`` int64 [B, Lmax]
        (1 on real tokens), ``labels`` int64 [B, Lmax] (-100 on padding) and the count of the loss term
        ``ce`` (int64 scalar): the labelled positions :meth:`loss` predicts, i.e. after the causal shift.
        """
        if not examples:
            raise ValueError("collate needs at least one example")
        if self.frames_per_position:
            return grouped.collate(self, examples)
        lmax = max(len(e["input_ids"]) for e in examples)
        input_ids = torch.full((len(examples), lmax), self.layout.pad_id, dtype=torch.long)
        labels = torch.full((len(examples), lmax), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(examples), lmax), dtype=torch.long)
        positions = torch.zeros((len(examples), lmax), dtype=torch.long) if "position_ids" in examples[0] else None
        for i, e in enumerate(examples):
            n = len(e["input_ids"])
            input_ids[i, :n] = torch.as_tensor(e["input_ids"], dtype=torch.long)
            labels[i, :n] = torch.as_tensor(e["labels"], dtype=torch.long)
            attention_mask[i, :n] = 1
            if positions is not None:
                positions[i, :n] = torch.as_tensor(e["position_ids"], dtype=torch.long)
        num_targets = (labels[:, 1:] != IGNORE_INDEX).sum()  # position t predicts label t + 1
        batch = with_counts({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels},
                            {"ce": num_targets})
        return batch if positions is None else batch | {"position_ids": positions}

    @property
    def flash_positions(self) -> bool:  # type: ignore[override]
        """Not with ``text_position_scale``: its restarting positions would read as packed examples to
        flash-attention's path for unpacked prompts (synthesis)."""
        return self.text_position_scale is None

    def collate_packed(self, examples: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
        """:meth:`collate`'s examples end to end in one row [1, N] (or [1, N, S] with ``frames_per_position``),
        each with its own positions; the count of ``ce`` is the same as padded."""
        batch = pack(examples)
        return with_counts(batch, {"ce": (batch["labels"][:, 1:] != IGNORE_INDEX).sum()})

    def loss(self, module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossTerms:
        """One term, ``ce``: the summed next-token cross-entropy over labelled positions, and their count.

        ``module`` is the (possibly accelerate/DDP/FSDP-wrapped) ``self.module``; ``batch`` comes from
        :meth:`collate`, already on the module's device. The sum is a float32 scalar, the count an int64
        scalar (the loop divides by the count of a whole gradient-accumulation window).
        """
        if self.frames_per_position:
            return grouped.loss(self, module, batch)
        inputs = model_inputs(batch)
        targets = batch["labels"][:, 1:]
        keep = targets != IGNORE_INDEX
        if chunkable(self.loss_kernel, self.module.get_output_embeddings()):  # train.chunked_loss: no logits
            hidden = causal_lm_hidden(module, **inputs)[:, :-1][keep]
            ce = head_loss(hidden, self.module.get_output_embeddings(), targets[keep], self.loss_kernel,
                           self.loss_chunk_tokens)
            return {"ce": LossTerm(ce.total, keep.sum())}
        out = module(**inputs, use_cache=False)
        # Only labelled positions reach the (float32) softmax: saves memory on text and padding.
        logits = out.logits[:, :-1][keep].float()  # [N, V]
        loss_sum = F.cross_entropy(logits, targets[keep], reduction="sum")
        return {"ce": LossTerm(loss_sum, keep.sum())}

    # ---------------------------------------------------------------- optimisation and strategies

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """Trainable matrices decayed, norms and biases not (:func:`~voxrelay.models.base.decay_groups`)."""
        return decay_groups(self.module, weight_decay)

    def lora_defaults(self) -> LoraDefaults:
        """Adapters on every attention and MLP projection; the audio ids are new rows of the embeddings and head
        (with ``init_from`` a plain LM they start random): those rows train (``train.lora.embeddings``; ``full``:
        both matrices in full)."""
        return LoraDefaults(r=32, alpha=64, dropout=0.0, rslora=True, target_modules=list(LORA_TARGETS),
                            modules_to_save=[], embeddings=["lm_head", "embed_tokens"])

    # ---------------------------------------------------------------- synthesis

    def speak(self, request: Request, codec, max_frames: int | None = None, temperature: float = 0.8,
              top_k: int | None = 50, seed: int = 0) -> Speech:
        """:meth:`generate` the request's text and speaker, decoded by ``codec`` (no description, no voice prompts)."""
        return speak_codes(self, request, codec, max_frames, temperature, top_k, seed)

    @torch.no_grad()
    def generate(
        self,
        text: str,
        speaker: str | None = None,
        max_frames: int | None = None,
        temperature: float = 0.8,
        top_k: int | None = 50,
        seed: int = 0,
    ) -> np.ndarray:
        """Sample codes int64 [K, T] for ``text`` (T >= 1), deterministic for a ``seed``.

        Decoding is constrained: each position may only take ids of the codebook due next, and
        AUDIO_END only at a frame boundary after at least one frame. Stops at AUDIO_END or after
        ``max_frames`` frames; ``max_frames`` is capped so the sequence fits ``max_seq_len``.
        ``temperature <= 0`` is greedy; ``top_k`` None or 0 samples from the whole codebook.
        """
        prompt = self._prompt_ids(text, speaker)
        room = self.max_seq_len - len(prompt) - 1
        budget = room * self.frames_per_position if self.frames_per_position else room // self.layout.num_codebooks
        if budget < 1:
            raise SequenceTooLongError(
                f"the prompt of {text[:40]!r} takes {len(prompt)} tokens, leaving no room for one frame "
                f"in model.max_seq_len={self.max_seq_len}; shorten the text"
            )
        if max_frames is not None and max_frames < 1:
            raise ValueError(f"max_frames must be >= 1 (or None for the max_seq_len bound), got {max_frames}")
        max_frames = budget if max_frames is None else min(max_frames, budget)
        was_training = self.module.training
        self.module.eval()
        try:
            if self.frames_per_position:
                return grouped.decode(self, prompt, max_frames, temperature, top_k, seed)
            ids = self._decode(prompt, max_frames, temperature, top_k, seed)
        finally:
            self.module.train(was_training)
        return self.layout.ids_to_codes(np.asarray(ids, dtype=np.int64))

    def _decode(
        self, prompt: list[int], max_frames: int, temperature: float, top_k: int | None, seed: int
    ) -> list[int]:
        """The KV-cached sampling loop; returns the audio ids (whole frames, AUDIO_END excluded)."""
        layout, k_books = self.layout, self.layout.num_codebooks
        device = next(self.module.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        step_input = torch.tensor([prompt], dtype=torch.long, device=device)
        positions: dict[str, torch.Tensor] = {}
        if self.text_position_scale is not None:  # the mask is explicit: restarting positions are not packing
            positions = {"position_ids": torch.as_tensor(self._prompt_positions(len(prompt)), device=device)[None],
                         "attention_mask": torch.ones((1, len(prompt)), dtype=torch.long, device=device)}
        past: Any = None
        audio: list[int] = []
        while len(audio) < max_frames * k_books:
            out = self.module(input_ids=step_input, past_key_values=past, use_cache=True, **positions)
            past = out.past_key_values
            logits = out.logits[0, -1].float()  # [V]
            k = len(audio) % k_books
            lo, hi = layout.codebook_range(k)
            can_end = k == 0 and len(audio) > 0
            candidates = logits[lo:hi]
            if can_end:
                candidates = torch.cat([candidates, logits[layout.audio_end_id : layout.audio_end_id + 1]])
            choice = sample(candidates, temperature, top_k, generator)
            if can_end and choice == hi - lo:
                break
            audio.append(lo + choice)
            step_input = torch.tensor([[lo + choice]], dtype=torch.long, device=device)
            if positions:
                frame_position = self._audio_positions(len(audio) - 1, 1)
                positions = {"position_ids": torch.as_tensor(frame_position, device=device)[None]}
        return audio

