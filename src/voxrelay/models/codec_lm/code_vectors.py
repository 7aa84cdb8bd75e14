"""``model.audio_embedding: codec``: audio ids embedded through the codec's own vector of each code.

The input row of code c in codebook slot s is ``v[s % K, c] @ P[s]``: ``v`` the codec's vectors
(mel_kmeans: each centroid's log-mel), standardised per codebook and dimension, and ``P`` a learned
projection per slot [D, hidden]. Acoustically close codes then get close inputs, so a code the model
rarely saw in training (or picked itself at generation, near the one it meant) still reads as the
sound it stands for; a free row per code learns that only from data. Text and special ids keep their
free rows (the ``base`` embedding); its audio rows are unused.

A saved folder holds the computed rows as a plain embedding (:func:`plain_embedding`): it loads as a
plain Llama, and fine-tuning it goes on from those rows with ``audio_embedding: free``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from voxrelay.errors import UserError
from voxrelay.models.codec_lm.grouped import sum_slots


class CodeVectorsError(UserError, ValueError):
    """``model.audio_embedding: codec`` with data whose codec has no code vectors."""


class CodeVectorEmbedding(torch.nn.Module):
    """Embeds ids [B, L] or slot ids [B, L, S] (-1 = empty slot, rows summed); see the module doc.

    ``base``: the model's own ``nn.Embedding`` (text and special rows), ``vectors`` float32 [S, C, D]
    (the standardised vectors of each slot's codebook), ``proj`` the parameter [S, D, hidden],
    ``offset`` the first audio id.
    """

    def __init__(self, base: torch.nn.Embedding, vectors: torch.Tensor, proj: torch.nn.Parameter,
                 offset: int) -> None:
        super().__init__()
        self.base = base
        self.register_buffer("vectors", vectors, persistent=False)  # from the data, not the checkpoint
        self.proj = proj
        self.offset = offset

    @property
    def weight(self) -> torch.Tensor:
        """The whole table [V, hidden]: text and special rows, then every slot's audio rows."""
        audio = torch.einsum("scd,sdh->sch", self.vectors.to(self.proj.dtype), self.proj)
        return torch.cat([self.base.weight[: self.offset], audio.flatten(0, 1)])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        table = self.weight
        return F.embedding(ids, table) if ids.dim() < 3 else sum_slots(ids, table)


def standardised(vectors: np.ndarray, slots: int) -> torch.Tensor:
    """codec vectors [K, C, D] -> float32 [S, C, D]: zero mean, unit variance per codebook and dimension;
    slot s takes codebook s % K."""
    v = torch.as_tensor(np.asarray(vectors), dtype=torch.float32)
    v = (v - v.mean(1, keepdim=True)) / v.std(1, keepdim=True).clamp_min(1e-6)
    return v[torch.arange(slots) % v.shape[0]].contiguous()


def attach(module: torch.nn.Module, vectors: np.ndarray | None, slots: int, codebook_size: int,
           offset: int) -> None:
    """Give ``module`` (a causal LM) a :class:`CodeVectorEmbedding`; its projection is drawn from the
    global torch RNG (the caller seeds it) at the scale of a free row (std 0.02)."""
    if vectors is None:
        raise CodeVectorsError(
            "model.audio_embedding=codec embeds each code through the codec's vector of it, but this data's "
            "codec has none (the built-in codec.type=mel_kmeans has); set model.audio_embedding=free"
        )
    if tuple(np.shape(vectors)[1:2]) != (codebook_size,):
        raise CodeVectorsError(f"the codec's code vectors have shape {list(np.shape(vectors))}, not "
                               f"[K, {codebook_size}, D]; prepare the data again")
    v = standardised(vectors, slots)
    base = module.get_input_embeddings()
    proj = torch.nn.Parameter(torch.randn(slots, v.shape[-1], base.weight.shape[1]) * (0.02 / v.shape[-1] ** 0.5))
    module.set_input_embeddings(CodeVectorEmbedding(base, v.to(base.weight.device), proj, offset))


def plain_embedding(embedding: torch.nn.Module) -> torch.nn.Embedding:
    """An ``nn.Embedding`` holding ``embedding``'s table as plain rows (what a saved folder stores)."""
    weight = embedding.weight.detach().clone()
    plain = torch.nn.Embedding(weight.shape[0], weight.shape[1], device=weight.device, dtype=weight.dtype)
    plain.weight.data.copy_(weight)
    return plain
