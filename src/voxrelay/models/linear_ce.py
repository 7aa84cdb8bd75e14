"""Cross-entropy of a linear output head without its logits: what every family with a large vocabulary calls.

A materialised loss keeps ``tokens x vocab`` logits (Orpheus: 156,940 per token) and, while the log-softmax is
backpropagated, three fp32 tensors of that size (``voxrelay.plan.formulas.LOGITS_PEAK_PER_VOCAB``). Here the
tokens go through the head ``chunk_tokens`` at a time (:class:`LinearCrossEntropy`): each chunk's logits, their
log-sum-exp, the target's logit, and, when a gradient is wanted, ``softmax - one_hot`` turned at once into the
chunk's share of the hidden states' and the head's gradients; the chunk's logits are then dropped. The
gradients are thus made in the forward (Liger-Kernel's fused linear cross-entropy does the same), not by
recomputing each chunk's logits in the backward: one matmul fewer per chunk (3 like the materialised loss,
not 4), at the same peak (the head's gradient exists from the loss on in both). The backward only scales them
by the incoming gradient.

On CUDA with Liger-Kernel installed (``pip install 'voxrelay[kernels]'``) its Triton kernel does the same
(:func:`pick_kernel`); elsewhere this portable path. Equal to the materialised loss within float tolerance
(tests/unit/models/test_linear_ce.py): sums, per-token values and gradients.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
CHUNKED, LIGER, MATERIALISED = "chunked", "liger", "materialised"


class HeadLoss(NamedTuple):
    """``total``: summed cross-entropy of the labelled rows (float32 scalar, differentiable); ``split``: its part
    over the rows of the ``split`` mask given to :func:`head_loss` (detached; 0 without a mask)."""

    total: torch.Tensor
    split: torch.Tensor


class LinearCrossEntropy(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], bias [V] or None, targets int64 [N]) -> (the summed cross-entropy of the
    rows whose target is not ``ignore_index``, float32 scalar; each row's cross-entropy, float32 [N], 0 on
    ignored rows, not differentiable). The logits are computed as the head computes them and the softmax in
    float32, as the materialised loss does; the gradients' matmuls run in the same precision as the materialised
    backward's (under autocast its low-precision dtype; else the weight's), accumulated in float32."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, chunk_tokens: int, ignore_index: int,
                grad_enabled: bool) -> tuple[torch.Tensor, torch.Tensor]:
        # under no_grad (evaluation) needs_input_grad still says what requires grad: nothing is made then
        need_h, need_w, need_b = (grad_enabled and need for need in ctx.needs_input_grad[:3])
        grads = _Grads(hidden, weight, bias, need_h, need_w, need_b and bias is not None)
        per_token = torch.zeros(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        compute = _compute_weight(weight, hidden.device.type)
        for start in range(0, hidden.shape[0], chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            per_token[rows] = _chunk(hidden[rows], compute, bias, targets[rows], ignore_index, grads, rows)
        del compute
        ctx.grads = grads.finish(weight, bias)
        ctx.mark_non_differentiable(per_token)
        return per_token.sum(), per_token

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor, _grad_rows: torch.Tensor | None):
        made, ctx.grads = ctx.grads, None  # each scaled in place, once: a second backward is an error
        if made is None:
            raise RuntimeError("LinearCrossEntropy: backward ran twice over one forward; call the loss again")
        scaled = [None if g is None else (g if bool(grad_total == 1) else g.mul_(grad_total.to(g.dtype)))
                  for g in made]
        return (*scaled, None, None, None, None)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor, chunk_tokens: int,
                         ignore_index: int = IGNORE_INDEX) -> tuple[torch.Tensor, torch.Tensor]:
    """:class:`LinearCrossEntropy` (its gradients made only where autograd records)."""
    return LinearCrossEntropy.apply(hidden, weight, bias, targets, chunk_tokens, ignore_index,
                                    torch.is_grad_enabled())


class _Grads:
    """The float32 accumulators of one :class:`LinearCrossEntropy` forward (None where no gradient is wanted)."""

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, need_h: bool,
                 need_w: bool, need_b: bool):
        self.hidden = torch.empty_like(hidden) if need_h else None
        self.weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        self.bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None

    @property
    def wanted(self) -> bool:
        return self.hidden is not None or self.weight is not None or self.bias is not None

    def finish(self, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
        w = None if self.weight is None else self.weight.to(weight.dtype)
        b = None if self.bias is None else self.bias.to(bias.dtype)
        return self.hidden, w, b


def _chunk(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, t: torch.Tensor, ignore_index: int,
           grads: _Grads, rows: slice) -> torch.Tensor:
    """One chunk's per-row cross-entropy [c] (float32); its gradients go into ``grads``. Only one [c, V] float32
    tensor is alive at a time: the logits become exp(logits - max), then the softmax, then its gradient, in place."""
    logits = F.linear(h, weight, bias)  # under autocast as the head's own forward would run
    z = logits.float()
    del logits  # a float32 head: z is the same tensor; otherwise the low-precision copy goes now
    keep = t != ignore_index
    safe = torch.where(keep, t, 0)
    picked = z.gather(1, safe[:, None])[:, 0]
    top = z.amax(dim=1, keepdim=True)
    z.sub_(top).exp_()
    total = z.sum(dim=1, keepdim=True)
    losses = torch.where(keep, top[:, 0] + total[:, 0].log() - picked, 0.0)
    if not grads.wanted:
        return losses
    z.div_(total)  # softmax
    z.scatter_add_(1, safe[:, None], -keep[:, None].to(z.dtype))  # - one_hot(target) on labelled rows
    z.masked_fill_(~keep[:, None], 0.0)  # ignored rows add nothing
    if grads.bias is not None:
        grads.bias.add_(z.sum(dim=0))
    autocast = torch.is_autocast_enabled(h.device.type)  # then matmul casts z (and h) itself
    if not autocast and weight.dtype != torch.float32:
        z, h = z.to(weight.dtype), h.to(weight.dtype)
    if grads.hidden is not None:
        grads.hidden[rows] = torch.matmul(z, weight).to(grads.hidden.dtype)
    if grads.weight is not None:
        if autocast or weight.dtype != torch.float32:  # a low-precision product, added to the float32 sum
            grads.weight.add_(torch.matmul(z.T, h))
        else:
            grads.weight.addmm_(z.T, h)
    return losses


def _compute_weight(weight: torch.Tensor, device_type: str) -> torch.Tensor:
    """The weight the chunks multiply by: under autocast a frozen fp32 weight is cast once for all chunks (a
    trainable one is cast once anyway: autocast caches casts of leaves that require grad)."""
    if not torch.is_autocast_enabled(device_type) or (weight.requires_grad and weight.is_leaf):
        return weight
    dtype = torch.get_autocast_dtype(device_type)
    return weight.to(dtype) if weight.is_floating_point() and weight.dtype != dtype else weight


def pick_kernel(device_type: str, chunked: bool, liger_importable: bool | None = None) -> str:
    """Which loss a run uses: ``materialised`` (``train.chunked_loss=false``), ``liger`` (Liger-Kernel's fused
    Triton kernel: a CUDA device with liger_kernel importable) or the portable ``chunked`` one."""
    if not chunked:
        return MATERIALISED
    if device_type != "cuda":
        return CHUNKED
    if liger_importable is None:
        liger_importable = all(importlib.util.find_spec(m) is not None for m in ("liger_kernel", "triton"))
    return LIGER if liger_importable else CHUNKED


def describe_kernel(kernel: str, chunk_tokens: int) -> str:
    """The run log's line about the loss (said once, with the first lines of a run)."""
    return {MATERIALISED: "loss: materialised logits",
            LIGER: "loss: Liger-Kernel's fused linear cross-entropy (CUDA, Triton): no logits kept",
            CHUNKED: f"loss: chunked linear cross-entropy, {chunk_tokens} tokens per chunk: no logits kept "
                     "(on CUDA, `pip install 'voxrelay[kernels]'` for Liger-Kernel's fused kernel)"}[kernel]


def head_parts(head: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight [V, H], bias) the output head ``head`` multiplies by, or None for a head this loss cannot stand
    in for (then the family keeps the materialised loss). peft's wrappers of a head trained in full
    (``modules_to_save``) or by rows (trainable tokens) give the weight their forward uses."""
    peft_other = sys.modules.get("peft.utils.other")  # a head wrapped by peft exists only once peft is imported:
    wrapper = peft_other.AuxiliaryTrainingWrapper if peft_other else ()  # importing it here costs 1.4 s (bnb)
    if isinstance(head, wrapper):
        if getattr(head, "disable_adapters", False):
            return head_parts(head.original_module)
        parts = head.weight, getattr(head, "bias", None)
    elif type(head).forward is torch.nn.Linear.forward:  # a plain Linear (a LoRA'd head is not one)
        parts = head.weight, head.bias
    else:
        return None
    # FSDP2 gathers a unit's weights only inside its forward: a head used after it holds its shard (a DTensor),
    # and its gradient must go through FSDP's reduce-scatter; such a head keeps the materialised loss
    return None if any(_is_dtensor(p) for p in parts) else parts


def _is_dtensor(t: torch.Tensor | None) -> bool:
    if t is None or not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def chunkable(kernel: str, head: torch.nn.Module) -> bool:
    """Whether :func:`head_loss` will stand in for ``head``'s logits (else a family computes them as before)."""
    return kernel != MATERIALISED and head_parts(head) is not None


def head_loss(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, kernel: str, chunk_tokens: int,
              split: torch.Tensor | None = None) -> HeadLoss:
    """Summed cross-entropy of ``head(hidden)`` [N, V] against ``targets`` int64 [N] (``-100``: no loss), and
    its part over the rows where ``split`` (bool [N]) is set. ``kernel``: :func:`pick_kernel`'s choice;
    ``materialised``, or a head :func:`head_parts` does not know, computes the logits as before."""
    parts = None if kernel == MATERIALISED else head_parts(head)
    if parts is None:
        losses = F.cross_entropy(head(hidden).float(), targets, ignore_index=IGNORE_INDEX, reduction="none")
        return HeadLoss(losses.sum(), losses.detach()[split].sum() if split is not None else _zero(hidden))
    weight, bias = parts
    if kernel == LIGER:
        return _liger(hidden, weight, bias, targets, split)
    total, per_token = linear_cross_entropy(hidden, weight, bias, targets, chunk_tokens)
    return HeadLoss(total, per_token[split].sum() if split is not None else _zero(hidden))


def _liger(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
           split: torch.Tensor | None) -> HeadLoss:
    """Liger's kernel returns only the sum: with a ``split`` it runs once on each side of it (the same rows,
    hence the same work, in two calls)."""
    from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss

    fused = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")
    if split is None:
        return HeadLoss(fused(weight, hidden, targets, bias).float(), _zero(hidden))
    inside = fused(weight, hidden[split], targets[split], bias).float()
    outside = fused(weight, hidden[~split], targets[~split], bias).float()
    return HeadLoss(inside + outside, inside.detach())


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=torch.float32, device=like.device)


def causal_lm_hidden(module: torch.nn.Module, **inputs: Any) -> torch.Tensor:
    """The final hidden states [B, L, H] (after the last norm: what the head multiplies) of a transformers causal
    LM, through ``module``'s own forward (so DDP, FSDP2 and peft wrappers do their part) with the head run on no
    position (``logits_to_keep`` an empty index): no logits are made. They are taken from the final norm's output
    (a forward hook), not from ``output_hidden_states``: that tuple would hold every layer's input on the device
    until the forward ends, undoing ``train.activation_offload``."""
    keep_none = torch.zeros(0, dtype=torch.long, device=inputs["input_ids"].device)
    norm = _final_norm(module)
    if norm is None:  # a causal LM without a decoder.norm: every layer's output, the last one kept
        out = module(**inputs, use_cache=False, logits_to_keep=keep_none, output_hidden_states=True)
        return out.hidden_states[-1]
    captured: list[torch.Tensor] = []
    hook = norm.register_forward_hook(lambda _mod, _inp, out: captured.append(out))
    try:
        module(**inputs, use_cache=False, logits_to_keep=keep_none)
    finally:
        hook.remove()
    return captured[-1]


def _final_norm(module: torch.nn.Module) -> torch.nn.Module | None:
    """The decoder's final norm of a (DDP-, peft-wrapped) transformers causal LM, or None."""
    inner = getattr(module, "module", module)  # DDP
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner  # peft
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else None
    norm = getattr(decoder, "norm", None)
    return norm if isinstance(norm, torch.nn.Module) else None


def choose_loss(model: Any, tc: Any, device_type: str, say: bool = True) -> None:
    """``train.chunked_loss``: the kernel of the family's head loss (:func:`voxrelay.models.linear_ce.pick_kernel`:
    Liger-Kernel's on CUDA when installed, else the portable chunked one, or the materialised logits), said in
    the run's first lines (``say``). A family whose loss has no such head (``chunked_heads`` false) keeps its own."""
    # FSDP2 gathers the head's shard only inside the root's forward, and the causal LMs' loss runs after it
    chunked = tc.chunked_loss and tc.strategy != "fsdp"
    model.loss_kernel = pick_kernel(device_type, chunked)
    model.loss_chunk_tokens = tc.loss_chunk_tokens
    if not say:
        return
    if model.chunked_heads:
        log.info(describe_kernel(model.loss_kernel, tc.loss_chunk_tokens) +
                 (" (train.strategy=fsdp)" if tc.chunked_loss and not chunked else ""))
    elif tc.chunked_loss:  # said too, so the first lines always name the loss
        log.info("loss: this %s model's own, logits materialised (train.chunked_loss applies to one output "
                 "head over the vocabulary, which this model's loss does not have)", model.family)
