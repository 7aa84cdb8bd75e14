"""Packed batches (``train.packing``): a micro-batch's examples laid end to end in one row, no padding.

Each example keeps its own position ids (0.. as alone, or the family's own, e.g. codec_lm's text position
scale), attention never crosses examples, and the loss covers exactly what it covers unpacked: each example's
first label is dropped (alone, the causal shift drops it), so the last token of one example predicts nothing
of the next. A packed batch carries ``cu_seq_lens_q``/``cu_seq_lens_k`` (int32 [D + 1], where each example
starts, then the total) and ``max_length_q``/``max_length_k`` (its longest example): the arguments
transformers passes from the model's forward down to its attention function.

The attention (:func:`enable`): flash-attention's varlen kernel where it is installed, the model runs on CUDA
in bf16/fp16, and the family's positions never restart inside an example (transformers' ``flash_attention_2``
reads those arguments; it would also take restarting positions of an unpacked prompt for packing); elsewhere
:data:`PACKED_SDPA`, SDPA run example by example (causal, ``T_i x T_i`` each: never the ``N x N`` of one
masked row), which hands an unpacked batch to transformers' own SDPA path unchanged. Its loop over the examples
runs outside ``torch.compile`` (compiled layers call it between their compiled parts) and reads the examples'
bounds from the device once per forward, not once per layer.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import torch

IGNORE_INDEX = -100
PACKED_SDPA = "voxrelay_packed_sdpa"
FLASH = "flash_attention_2"
KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
_registered = False


def packed_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [1, H, N, D], key/value [1, Hkv, N, D] -> [1, N, H, D].
    With ``cu_seq_lens_q`` each example attends causally to itself only; without, transformers' SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    starts = kwargs.pop("cu_seq_lens_q", None)
    for k in KEYS[1:]:
        kwargs.pop(k, None)
    if starts is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    return _per_example_call(module, query, key, value, starts, dropout, scaling), None


_last_bounds: tuple[Any, list[int]] = (None, [])


def _bounds(starts: torch.Tensor) -> list[int]:
    """``starts`` as ints, read once for the tensor every layer of a forward gets (one device sync, not one per
    layer and recompute)."""
    global _last_bounds
    if _last_bounds[0] is not starts:
        _last_bounds = (starts, starts.tolist())
    return _last_bounds[1]


def _per_example(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 starts: torch.Tensor, dropout: float, scaling: float | None) -> torch.Tensor:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = _bounds(starts)
    parts = [sdpa_attention_forward(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None,
                                    dropout=dropout, scaling=scaling, is_causal=e - s > 1)[0]
             for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
    return torch.cat(parts, dim=1)


# what packed_sdpa calls: _per_example kept out of torch.compile's graphs (its Python loop over the examples'
# bounds) once register() made it so; not at import, where torch.compiler.disable would import dynamo (1.3 s of
# every process that merely imports a family: plan, synthesize, export, eval)
_per_example_call = _per_example


def register() -> None:
    """Make :data:`PACKED_SDPA` an attention implementation transformers knows (with SDPA's masks)."""
    global _registered, _per_example_call
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    _per_example_call = torch.compiler.disable(_per_example)
    AttentionInterface.register(PACKED_SDPA, packed_sdpa)
    AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)
    _registered = True


def kernel(device_type: str, flash_ok: bool) -> str:
    """The attention packed batches use on ``device_type``: flash-attention's varlen kernel on CUDA where
    ``flash_ok`` (bf16/fp16 compute, positions that never restart inside an example) and transformers finds a
    working ``flash_attn``, else SDPA example by example."""
    if device_type == "cuda" and flash_ok and importlib.util.find_spec("flash_attn") is not None:
        from transformers.utils import is_flash_attn_2_available

        if is_flash_attn_2_available():
            return FLASH
    return PACKED_SDPA


def enable(module: torch.nn.Module, device_type: str, flash_ok: bool = False) -> str:
    """Switch a transformers model (or a peft model's base) to the attention packed batches need (see
    :func:`kernel`); returns its name. Unpacked batches (evaluation, synthesis) get the plain SDPA path through
    :data:`PACKED_SDPA`, or flash-attention's own padded path."""
    base = module.get_base_model() if hasattr(module, "get_base_model") else module
    name = kernel(device_type, flash_ok)
    if name == PACKED_SDPA:
        register()
    base.set_attn_implementation(name)
    return name


def pack(examples: list[dict[str, np.ndarray]], keys: tuple[str, ...] = ("input_ids", "labels")) -> dict:
    """Examples (``input_ids``/``labels`` [L_i, ...], optional ``position_ids`` [L_i]) -> one row: each of
    ``keys`` [1, N, ...] (N = sum of L_i), ``position_ids`` [1, N], ``attention_mask`` ones [1, N] and the
    varlen arguments (see the module's docstring). Each example's first label is -100."""
    if not examples:
        raise ValueError("pack needs at least one example")
    sizes = [len(e["input_ids"]) for e in examples]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    batch: dict[str, torch.Tensor] = {}
    for key in keys:
        batch[key] = torch.as_tensor(np.concatenate([e[key] for e in examples]), dtype=torch.long)[None]
    batch["labels"][0, starts[:-1]] = IGNORE_INDEX
    positions = [e["position_ids"] if "position_ids" in e else np.arange(n) for e, n in zip(examples, sizes,
                                                                                             strict=True)]
    batch["position_ids"] = torch.as_tensor(np.concatenate(positions), dtype=torch.long)[None]
    batch["attention_mask"] = torch.ones((1, int(starts[-1])), dtype=torch.long)
    cu = torch.as_tensor(starts, dtype=torch.int32)
    longest = torch.tensor(max(sizes), dtype=torch.long)
    return batch | {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu.clone(), "max_length_q": longest,
                    "max_length_k": longest.clone()}


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What a family's loss passes to the model: ids, mask, positions, and a packed batch's varlen arguments
    (their lengths as ints, what the kernels take)."""
    inputs: dict[str, Any] = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
                              "position_ids": batch.get("position_ids")}
    if "cu_seq_lens_q" in batch:
        inputs |= {"cu_seq_lens_q": batch["cu_seq_lens_q"], "cu_seq_lens_k": batch["cu_seq_lens_k"],
                   "max_length_q": int(batch["max_length_q"]), "max_length_k": int(batch["max_length_k"])}
    return inputs


def padded_fraction(batch: dict[str, torch.Tensor]) -> float:
    """Share of a batch's positions that are padding (0 for a packed batch)."""
    mask = batch["attention_mask"]
    return 1.0 - float(mask.sum()) / max(mask.numel(), 1)
