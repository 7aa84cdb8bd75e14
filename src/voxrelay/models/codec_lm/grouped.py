"""codec_lm with ``model.frames_per_position`` = G: one sequence position per G audio frames.

A position embeds all ``K * G`` codes of its frames (the sum of their rows; each of the S = K * G
slots, frame g and codebook k at slot ``g * K + k``, has its own id range, so the order of the
frames is kept) and predicts the next position's S codes at once, one softmax per slot over that
slot's id range: the slots' rows of ``lm_head`` are S heads over one hidden state. AUDIO_END takes
the place of the frame after the last (a choice of the codebook-0 slots, k = 0), so it ends the
utterance inside a group; the slots after it are empty. The sequence is ``[BOS, text...,
AUDIO_START, group 0, group 1, ...]``, ``ceil((T + 1) / G)`` groups for T frames: G times fewer
audio positions than one frame per position, which shortens the
text-to-audio alignment the attention must learn and the compute per utterance (Tacotron's
reduction factor; MusicGen/Moshi predict a frame's codebooks in parallel the same way).

Examples carry ``input_ids`` and ``labels`` int64 [L, S]: text, special and padding positions fill
slot 0 and leave -1 (no id) in the others, as do the slots after AUDIO_END (no input, no loss).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from voxrelay.models.base import LossTerm, LossTerms, with_counts
from voxrelay.models.packing import model_inputs
from voxrelay.models.sampling import sample

if TYPE_CHECKING:
    from voxrelay.models.codec_lm.model import CodecLM

IGNORE_INDEX = -100
NO_ID = -1


class SlotSumEmbedding(torch.nn.Embedding):
    """``nn.Embedding`` that also takes ids [B, L, S] (-1 = empty slot) and sums each position's rows.

    The class of a loaded model's ``embed_tokens`` is switched to this one (:func:`enable`): the
    weight and its name in the state dict stay those of a plain Llama.
    """

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) if ids.dim() < 3 else sum_slots(ids, self.weight, self.padding_idx)


def sum_slots(ids: torch.Tensor, table: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
    """Slot ids [B, L, S] (-1 = empty) -> the sum of each position's rows of ``table``, [B, L, H]."""
    present = (ids >= 0).unsqueeze(-1)
    rows = F.embedding(ids.clamp(min=0), table, padding_idx)  # [B, L, S, H]
    return (rows * present.to(rows.dtype)).sum(-2)


def enable(module: torch.nn.Module) -> None:
    """Let ``module`` (a causal LM) embed slot ids [B, L, S]."""
    embedding = module.get_input_embeddings()
    if not isinstance(embedding, torch.nn.Embedding):
        raise TypeError(f"frames_per_position needs an nn.Embedding input layer, got {type(embedding).__name__}")
    embedding.__class__ = SlotSumEmbedding


def group_codes(codes: np.ndarray, frames: int) -> np.ndarray:
    """codes int [K, T] -> slot codes int64 [K * G, ceil(T / G)], frame g of a group at slots g*K..g*K+K-1;
    the slots past frame T - 1 hold -1."""
    codes = np.asarray(codes, dtype=np.int64)
    k_books, t = codes.shape
    n = -(-t // frames)
    padded = np.full((k_books, n * frames), NO_ID, dtype=np.int64)
    padded[:, :t] = codes
    return padded.reshape(k_books, n, frames).transpose(2, 0, 1).reshape(k_books * frames, n)


def ungroup_codes(slots: np.ndarray, frames: int) -> np.ndarray:
    """slot codes int [K * G, n] -> codes int64 [K, n * G] (the inverse of :func:`group_codes`)."""
    slots = np.asarray(slots, dtype=np.int64)
    k_books = slots.shape[0] // frames
    return slots.reshape(frames, k_books, -1).transpose(1, 2, 0).reshape(k_books, -1)


def encode_example(lm: CodecLM, prompt: list[int], codes: np.ndarray) -> dict[str, np.ndarray]:
    """``input_ids``/``labels`` int64 [len(prompt) + n, S] (and ``position_ids`` [L] with a text
    position scale) of a prompt and codes [K, T]; n = ceil((T + 1) / G) groups, AUDIO_END included."""
    layout, slots, frames = lm.layout, lm.layout.num_codebooks, lm.frames_per_position
    k_books, t = np.asarray(codes).shape
    with_end = np.full((k_books, t + 1), NO_ID, dtype=np.int64)
    with_end[:, :t] = codes
    grouped = group_codes(with_end, frames)  # [S, n]
    offsets = layout.audio_offset + np.arange(slots, dtype=np.int64)[:, None] * layout.codebook_size
    audio = np.where(grouped >= 0, grouped + offsets, NO_ID).T  # [n, S]
    audio[t // frames, (t % frames) * k_books] = layout.audio_end_id
    text = np.full((len(prompt), slots), NO_ID, dtype=np.int64)
    text[:, 0] = prompt
    input_ids = np.concatenate([text, audio])
    labels = np.where(input_ids >= 0, input_ids, IGNORE_INDEX)
    labels[: len(prompt)] = IGNORE_INDEX
    example = {"input_ids": input_ids, "labels": labels}
    if lm.text_position_scale is not None:
        example["position_ids"] = np.concatenate([lm._prompt_positions(len(prompt)),
                                                  1 + np.arange(len(audio), dtype=np.int64)])
    return example


def collate(lm: CodecLM, examples: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """Right-pad into ``input_ids``/``labels`` int64 [B, Lmax, S], ``attention_mask`` [B, Lmax] and the
    count of labelled slots (the loss term ``ce``)."""
    lmax, slots = max(len(e["input_ids"]) for e in examples), lm.layout.num_codebooks
    input_ids = torch.full((len(examples), lmax, slots), NO_ID, dtype=torch.long)
    input_ids[:, :, 0] = lm.layout.pad_id
    labels = torch.full((len(examples), lmax, slots), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), lmax), dtype=torch.long)
    positions = torch.zeros((len(examples), lmax), dtype=torch.long) if "position_ids" in examples[0] else None
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        input_ids[i, :n] = torch.as_tensor(e["input_ids"])
        labels[i, :n] = torch.as_tensor(e["labels"])
        attention_mask[i, :n] = 1
        if positions is not None:
            positions[i, :n] = torch.as_tensor(e["position_ids"])
    batch = with_counts({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels},
                        {"ce": (labels[:, 1:] != IGNORE_INDEX).sum()})
    return batch if positions is None else batch | {"position_ids": positions}


def slot_scores(lm: CodecLM, logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] -> [..., S, C + 1]: each slot's codes, then AUDIO_END (a frame's first code: the
    slots g * K; -inf elsewhere)."""
    layout, slots = lm.layout, lm.layout.num_codebooks
    audio = logits[..., layout.audio_offset:].unflatten(-1, (slots, layout.codebook_size))
    end = torch.full((*audio.shape[:-1], 1), float("-inf"), dtype=logits.dtype, device=logits.device)
    k_books = slots // lm.frames_per_position
    end[..., ::k_books, 0] = logits[..., layout.audio_end_id, None]
    return torch.cat([audio, end], dim=-1)


def loss(lm: CodecLM, module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossTerms:
    """Summed cross-entropy of every labelled slot (each over its own codes + AUDIO_END), and their count."""
    out = module(**model_inputs(batch), use_cache=False)
    targets = batch["labels"][:, 1:]  # [B, L-1, S]
    keep = (targets != IGNORE_INDEX).any(-1)
    scores = slot_scores(lm, out.logits[:, :-1][keep].float())  # [N, S, C + 1]
    layout, targets = lm.layout, targets[keep]
    slot_base = layout.audio_offset + torch.arange(targets.shape[-1], device=targets.device) * layout.codebook_size
    index = torch.where(targets == layout.audio_end_id, layout.codebook_size, targets - slot_base)
    index = torch.where(targets == IGNORE_INDEX, IGNORE_INDEX, index)
    loss_sum = F.cross_entropy(scores.flatten(0, 1), index.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    return {"ce": LossTerm(loss_sum, (index != IGNORE_INDEX).sum())}


def decode(lm: CodecLM, prompt: list[int], max_frames: int, temperature: float, top_k: int | None,
           seed: int) -> np.ndarray:
    """The KV-cached sampling loop, one group of S codes per step -> codes int64 [K, T], T <= max_frames.

    A frame's first code may be AUDIO_END (after at least one frame): the utterance ends there."""
    layout, slots = lm.layout, lm.layout.num_codebooks
    k_books = slots // lm.frames_per_position
    device = next(lm.module.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    step_input = torch.full((1, len(prompt), slots), NO_ID, dtype=torch.long, device=device)
    step_input[0, :, 0] = torch.tensor(prompt, device=device)
    extra: dict[str, Any] = {}
    if lm.text_position_scale is not None:
        extra = {"position_ids": torch.as_tensor(lm._prompt_positions(len(prompt)), device=device)[None],
                 "attention_mask": torch.ones((1, len(prompt)), dtype=torch.long, device=device)}
    past: Any = None
    frames: list[list[int]] = []
    positions = 0
    while len(frames) < max_frames:
        out = lm.module(input_ids=step_input, past_key_values=past, use_cache=True, **extra)
        past, positions = out.past_key_values, positions + 1
        scores = slot_scores(lm, out.logits[0, -1].float())  # [S, C + 1]
        ids = []
        for s in range(slots):
            first = s % k_books == 0
            if first and len(frames) == max_frames:
                return np.asarray(frames, dtype=np.int64).T
            choice = sample(scores[s] if first and frames else scores[s, :-1], temperature, top_k, generator)
            if choice == layout.codebook_size:  # AUDIO_END
                return np.asarray(frames, dtype=np.int64).T
            if first:
                frames.append([])
            frames[-1].append(choice)
            ids.append(layout.audio_offset + s * layout.codebook_size + choice)
        step_input = torch.tensor([[ids]], dtype=torch.long, device=device)
        if extra:
            extra = {"position_ids": torch.tensor([[positions]], dtype=torch.long, device=device)}
    return np.asarray(frames, dtype=np.int64).T
