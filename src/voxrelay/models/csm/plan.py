"""How ``voxrelay plan`` prices CSM (``Csm.plan_shape``): the backbone as the Llama-style
:class:`~voxrelay.plan.formulas.Shape` per position, and per position outside its layers what the depth decoder
saves: for the share of frames it learns, K positions through its own layers (their inputs projected from the
backbone's width), and its logits over K - 1 codebooks. Left out: its head's weights gathered per codebook, a
constant of (K - 1) x width x vocabulary per step (0.13 GB in bf16 for csm-1b), and its adapters' few tensors."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from voxrelay.models.seam import decoder_shape

if TYPE_CHECKING:
    from voxrelay.plan.formulas import Shape


def plan_shape(config: Any, module: Any, lora_rank: int, share: float) -> Shape:
    """The backbone of config ``config`` (``CsmConfig``) in ``module``, with the depth decoder priced outside it
    (its layers as saved without gradient checkpointing: an upper bound when the run checkpoints)."""
    from voxrelay.plan.formulas import layer_activation_bytes, outside_activation_bytes

    k = int(config.num_codebooks)
    depth = decoder_shape(config.depth_decoder_config, module, 0)

    def outside(s: Shape, compute: str) -> int:
        plain = dataclasses.replace(s, outside=None)
        item = 2 if compute == "bf16" else 4
        per_position = (depth.layers * layer_activation_bytes(depth, compute) + outside_activation_bytes(depth, compute)
                        + item * s.hidden)  # + the projection's input, at the backbone's width
        per_frame = k * per_position + 4 * (k - 1) * int(config.vocab_size)  # + float32 log-softmax
        return outside_activation_bytes(plain, compute) + 16 * k + int(share * per_frame)  # + codes, labels

    return decoder_shape(config, module, lora_rank, codebooks=k, outside=outside)
