"""How ``voxrelay plan`` prices Parler's decoder (``Parler.plan_shape``): its layer mapped onto the Llama-style
:class:`~voxrelay.plan.formulas.Shape` (the GELU MLP's two saved tensors of F as ``intermediate`` F / 2), and what
its LayerNorms, cross-attention and repeated K/V save beyond that table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from voxrelay.models.seam import decoder_shape

if TYPE_CHECKING:
    from voxrelay.plan.formulas import Shape


def plan_shape(dec: Any, module: Any, lora_rank: int) -> Shape:
    """The decoder of config ``dec`` (``ParlerDecoderConfig``) in ``module``; logits are K heads of V."""
    return decoder_shape(dec, module, lora_rank, intermediate=dec.ffn_dim // 2,
                         vocab=dec.num_codebooks * dec.vocab_size, codebooks=dec.num_codebooks,
                         layer_extra=layer_extra, outside=outside)


def layer_extra(s: Shape, compute: str) -> int:
    """What Parler's decoder layer saves per token beyond the Llama table, counted on CPU (saved tensors of 4
    widths, 1 vs 2 layers at 64 vs 128 tokens): the cross-attention's log-sum-exp and LayerNorm statistics,
    fp32's un-fused norms (8h), and the self-attention's K/V repeated from ``kv_dim`` to every head."""
    element = 4 if compute == "fp32" else 2
    repeated_kv = 2 * (s.heads * s.head_dim - s.kv_dim) * element
    fixed = {"bf16": 4, "autocast": 16, "fp32": 16}[compute]
    return (8 * s.hidden if compute == "fp32" else 0) + 4 * s.heads + fixed + repeated_kv


def cross_description_bytes(s: Shape, description_tokens: int, compute: str) -> int:
    """What each cross-attention layer saves per token of the description (not per decoder position): its input
    and the K/V repeated to every head. ~1-2% of a Parler micro-batch's activations (50 description tokens per
    600+ positions), so ``plan`` leaves it out of its per-position price."""
    return s.layers * description_tokens * (12 if compute == "fp32" else 6) * s.hidden


def outside(s: Shape, compute: str) -> int:
    """Per token outside Parler's layers: the summed codebook embeddings with sinusoids (no RoPE tables), the
    final LayerNorm's input, the int64 ids of every codebook."""
    return (2 if compute == "bf16" else 4) * s.hidden + 8 * s.codebooks + (4 if compute == "bf16" else 8)
