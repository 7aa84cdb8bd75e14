"""How ``voxrelay plan`` prices F5's DiT (``F5.plan_shape``): its block as the Llama-style
:class:`~voxrelay.plan.formulas.Shape` (the tanh-GELU MLP's two saved tensors of width F as ``intermediate`` F / 2,
every head its own keys and values), plus what the table lacks, counted on CPU in float32 (saved tensors of 6 shapes,
1 and 2 blocks, 400 frames; other precisions scaled by their element size, not measured): per block, the rotary
positions' float copies of queries and keys (about 10 bytes per attention channel); outside the blocks, per frame,
the time-conditioned input embedding and convolutional positions (about 28 bytes per channel of width), the text's
ConvNeXt blocks (44 bytes per channel per block, 4 more per channel), the mel in and the loss (about 1.6 kB)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from voxrelay.models.seam import decoder_shape

if TYPE_CHECKING:
    from voxrelay.plan.formulas import Shape


def plan_shape(sizes: Any, module: Any, lora_rank: int) -> Shape:
    """The DiT of ``sizes`` (:class:`~voxrelay.models.f5.dit.DiTSizes`) in ``module``; its output a mel frame."""
    inner = sizes.heads * sizes.dim_head

    def item(compute: str) -> float:
        return 0.5 if compute == "bf16" else 1.0

    def layer_extra(s: Shape, compute: str) -> int:
        return 10 * inner  # the rotary positions run in float32 whatever the compute dtype

    def outside(s: Shape, compute: str) -> int:
        per_channel = 28 * sizes.dim + 44 * sizes.text_dim * sizes.conv_layers + 4 * sizes.text_dim
        return int(item(compute) * per_channel) + 1645

    config = SimpleNamespace(hidden_size=sizes.dim, num_attention_heads=sizes.heads, head_dim=sizes.dim_head,
                             num_key_value_heads=sizes.heads, num_hidden_layers=sizes.depth,
                             vocab_size=sizes.mel_dim, intermediate_size=sizes.ff_mult * sizes.dim // 2)
    return decoder_shape(config, module, lora_rank, layer_extra=layer_extra, outside=outside)
