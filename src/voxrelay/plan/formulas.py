"""The byte counts behind ``voxrelay plan`` (:mod:`voxrelay.plan`): pure functions of tensor shapes, model
sizes and token counts, no torch needed. Units: bytes; ``GB`` = 10**9 bytes.

Parameters, gradients and optimizer states are counted tensor by tensor from the model built on the meta
device (so tied weights, LoRA adapters, modules_to_save copies and their dtypes come out exactly); the
unit tests build the real thing on CPU and compare byte for byte.

Activations (tensors saved for backward) are a formula per token per decoder layer, measured on CPU with
``torch.autograd.graph.saved_tensors_hooks`` (transformers 5.23 Llama, SDPA, torch 2.13) on several widths
and fitted exactly (``h`` hidden, ``kv`` key/value width = kv_heads x head_dim, ``I`` MLP width, ``nh``
heads, ``r`` LoRA rank x adapted Linears per layer):

====================  =======================================  =========================================
compute               full fine-tune, bytes/token/layer          LoRA
====================  =======================================  =========================================
bf16 (pure)           20h + 4kv + 8I + 4nh + 8                   36h + 4kv + 10I + 4nh + 8 + 4r
autocast bf16/fp16    30h + 4kv + 8I + 4nh + 8                   24h + 4kv + 8I + 4nh + 8 + 2r
fp32                  32h + 8kv + 16I + 4nh + 8                  same as full (not measured)
====================  =======================================  =========================================

Pure bf16 gives 131.2 KB for Llama-3.2-3B (h 3072, kv 1024, I 8192, nh 24): FACTS' 131 KB. Why the terms:
each RMSNorm keeps an fp32 copy of its input (4h) and its bf16 output (2h); SDPA keeps q, k, v, output
and a float32 log-sum-exp per head (4nh), the MLP gate, silu(gate), up and their product (8I). Under
autocast (accelerate's bf16 with fp32 master weights: the DDP path) the residual stream is fp32 (+10h);
peft casts the input of each adapter to its fp32 weights under pure bf16 (+16h + 2I). Outside the layers
per token: 6h + 4 head_dim + 12 (bf16) or 8h + 8 head_dim + 12 (fp32/autocast: fp32 RoPE tables).

Autocast also keeps a bf16 copy of every fp32 Linear weight for backward (2 bytes/parameter of the
layers' Linears and the output head): counted with the activations, because that is what they are.

Logits: the loss keeps 4 bytes x vocab per labelled token (fp32 log-softmax); while the log-softmax is
backpropagated it holds 12 bytes x vocab per token (its saved output, the incoming gradient and the new one):
measured as the peak of live tensors on CPU (fp32: 12.0 exactly, at 256 and 1,024 tokens) and implied by
``max_memory_allocated`` on an H200 (4,096 tokens of Orpheus-3B width: 12.0-12.3 in every row). The
``logits`` column is that peak. With ``train.chunked_loss`` it is one chunk's (:func:`chunked_logits_bytes`),
beside the head's gradient, which the chunked loss makes as it goes (float32, and under autocast each chunk's
bf16 product: the ``head`` phase's bytes), and one more float32 copy of it at the backward's end (measured);
the plan is 1.001 and 1.000 of the measured CPU peaks of tests/helpers/peak.py's two chunked rows (fp32 with a
frozen head: the loss phase; autocast with the head trained: the backward's end) and 0.998 with the head trained
under autocast at 1,024 tokens in 512-token chunks (the loss phase).

A step's peak is not the sum of the columns (see :func:`voxrelay.plan.per_gpu`): the loss' peak comes
before any weight gradient exists, and the gradients are whole only when the activations are gone.

Gradient checkpointing (transformers' per-layer checkpoint, reentrant or not): the forward pass keeps each
layer's input (residual dtype x h per token: 2h bf16, 4h fp32/autocast) and the final norm's tensors
(measured exactly); backward adds one recomputed layer's activations at a time (not measured: assumed
equal to a layer of the forward pass). ``train_step`` runs the backward outside the autocast region, so
autocast's cache of bf16 copies of trainable fp32 weights is freed when the forward ends: what stays is the
copy each matmul saved for its backward (every Linear's; under checkpointing only those outside the layers,
e.g. the output head, and the recomputed layer's), each freed by its own backward (measured: a step's peak
of live tensors equal to the plan's, 0.98-1.00, tests/unit/test_plan_peak.py).

Activation offload (``train.activation_offload``, under checkpointing): the layer inputs checkpointing keeps
(:func:`offloaded_activation_bytes`) wait in host memory (pinned on CUDA): at the loss none is on the GPU; while a
layer is recomputed only its own input is back. The host holds all of them from the forward's end until the
backward is done with the graph. Measured as the peak of live tensors on CPU with a hook that copies to a host
store the tracker does not count (tests/helpers/peak.py, row ``ddp-gc-offload-autocast``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

GB = 10**9
# CUDA context + cuBLAS/cuDNN workspaces + NCCL buffers seen by nvidia-smi but not by torch's allocator
OVERHEAD_FIXED = 1.5 * GB
# the caching allocator reserves more than it hands out (block rounding, fragmentation): ~3-10% in
# steady training loops; 5% of everything else is assumed
FRAGMENTATION = 0.05
LOGITS_SAVED_PER_VOCAB = 4
LOGITS_PEAK_PER_VOCAB = 12
# what the head's backward adds per vocabulary entry per token: the logits' gradient in fp32
LOGITS_GRAD_PER_VOCAB = 4
# the chunked loss: one chunk's fp32 logits, in place from logits to softmax to its gradient
LOGITS_CHUNK_PER_VOCAB = 4
# optimizers whose step runs tensor by tensor in Python, on a GPU too (voxrelay's Lion, transformers' Adafactor):
# two temporaries of the tensor being updated, like the unfused AdamW on CPU (peak of live tensors, measured)
UNFUSED_OPTIMIZERS = ("lion", "adafactor")
BNB_BLOCK = 256  # bitsandbytes' blockwise quantisation: one fp32 absmax per 256 elements, per state
BNB_MIN_8BIT = 4096  # tensors smaller than this keep fp32 states (bitsandbytes' min_8bit_size)
BNB_QMAPS = 2 * 256 * 4  # two shared fp32 quantisation maps of 256 entries per optimizer
NF4_BLOCK, NF4_NESTED_BLOCK = 64, 256  # QLoRA's NF4 weights: absmax per 64 weights, absmax of those per 256

# (h, kv, I, nh, const, r) coefficients of the table above, by (compute, lora)
ACTIVATION_COEFFS = {
    ("bf16", False): (20, 4, 8, 4, 8, 0), ("bf16", True): (36, 4, 10, 4, 8, 4),
    ("autocast", False): (30, 4, 8, 4, 8, 0), ("autocast", True): (24, 4, 8, 4, 8, 2),
    ("fp32", False): (32, 8, 16, 4, 8, 0), ("fp32", True): (32, 8, 16, 4, 8, 0),
}


@dataclass(frozen=True)
class Param:
    """One parameter tensor: ``shape``, ``itemsize`` (bytes per element), ``trainable``, whether it is
    the weight of a Linear that autocast copies to bf16 (``linear``) and whether it is in a decoder layer
    (``in_layer``: what gradient checkpointing recomputes; False: embeddings, final norm, output head)."""

    shape: tuple[int, ...]
    itemsize: int
    trainable: bool
    linear: bool = False
    in_layer: bool = True
    quantisable: bool = False  # a frozen Linear weight of a layer: what train.lora.base_bits quantises

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def shard_numel(self, shards: int) -> int:
        """Elements one rank holds when FSDP2 shards dim 0 over ``shards`` ranks (dim 0 padded up)."""
        if not self.shape or shards == 1:
            return self.numel
        return math.ceil(self.shape[0] / shards) * math.prod(self.shape[1:])


@dataclass(frozen=True)
class Shape:
    """Sizes of a Llama-style decoder: the activation formula's inputs. A family of another layout maps its
    layer onto these (``FamilyModelBase.plan_shape``), e.g. a plain GELU MLP of width F as ``intermediate`` F / 2
    (two saved tensors of F instead of four), and prices what the table lacks with ``layer_extra`` / ``outside``."""

    hidden: int
    intermediate: int
    heads: int
    kv_dim: int
    head_dim: int
    layers: int
    vocab: int  # logits per token (a multi-head model: every head's vocabulary, e.g. Parler's K x V)
    lora_targets: int = 0  # LoRA rank x adapted Linears per layer (0 = no LoRA)
    codebooks: int = 1  # token ids per position (e.g. one per codebook)
    # a layer unlike Llama's (the family's plan_shape sets these): bytes per token one layer saves beyond the table,
    # and per token outside the layers instead of the Llama decoder's; each (shape, compute) -> bytes
    layer_extra: Callable[[Shape, str], int] | None = field(default=None, compare=False)
    outside: Callable[[Shape, str], int] | None = field(default=None, compare=False)


def quantised_params(params: list[Param], bits: int) -> list[Param]:
    """``params`` as QLoRA holds them (:mod:`voxrelay.models.qlora`): each quantisable weight of n elements
    replaced by bitsandbytes' tensors. NF4 (``bits`` 4) with double quantisation: the packed codes (n/2
    bytes), one uint8 absmax per 64 weights, one fp32 absmax per 256 of those, an fp32 offset and the two
    code books (16 and 256 fp32 entries, one pair per layer): 0.5 + 1/64 + 1/4096 bytes (0.127 bit) per
    weight beyond the codes. int8 (``bits`` 8): n bytes and an fp32 scale per output row."""
    out: list[Param] = []
    for p in params:
        if not p.quantisable:
            out.append(p)
        elif bits == 4:
            blocks = math.ceil(p.numel / NF4_BLOCK)
            out += [Param((math.ceil(p.numel / 2), 1), 1, False), Param((blocks,), 1, False),
                    Param((math.ceil(blocks / NF4_NESTED_BLOCK),), 4, False), Param((), 4, False),
                    Param((16,), 4, False), Param((256,), 4, False)]
        else:
            out += [Param(p.shape, 1, False), Param((p.shape[0],), 4, False)]
    return out


def dequantised_bytes(params: list[Param], compute_item: int) -> int:
    """The largest quantised weight dequantised for its matmul (bitsandbytes' ``MatMul4Bit``: a copy in the
    base's dtype, cast to the compute dtype when that differs), alive beside a recomputed layer in backward."""
    largest = max(((p.numel, p.itemsize) for p in params if p.quantisable), default=(0, 0))
    return largest[0] * (largest[1] + (compute_item if compute_item != largest[1] else 0))


def weight_bytes(params: list[Param], shards: int = 1) -> int:
    return sum(p.shard_numel(shards) * p.itemsize for p in params)


def grad_bytes(params: list[Param], shards: int = 1) -> int:
    """Gradients have the parameter's dtype; frozen parameters have none."""
    return sum(p.shard_numel(shards) * p.itemsize for p in params if p.trainable)


def optimizer_bytes(params: list[Param], optimizer: str, shards: int = 1) -> int:
    """State bytes of ``optimizer`` (adamw | adamw_8bit | lion | lion_8bit | adafactor) after its first step."""
    trainable = [p for p in params if p.trainable]
    if optimizer == "adamw":  # exp_avg + exp_avg_sq in the parameter's dtype, + a float32 step counter
        return sum(2 * p.shard_numel(shards) * p.itemsize + 4 for p in trainable)
    if optimizer == "lion":  # the momentum, in the parameter's dtype
        return sum(p.shard_numel(shards) * p.itemsize for p in trainable)
    if optimizer in ("adamw_8bit", "lion_8bit"):  # 2 states (Adam) or 1 (Lion), each 8-bit with absmax per block
        states, total = (2 if optimizer == "adamw_8bit" else 1), 0
        for p in trainable:
            n = p.shard_numel(shards)
            if n < BNB_MIN_8BIT:
                total += states * 4 * n
            else:
                total += states * (n + 4 * math.ceil(n / BNB_BLOCK))
        qmaps = BNB_QMAPS * states // 2
        return total + (qmaps if any(p.shard_numel(shards) >= BNB_MIN_8BIT for p in trainable) else 0)
    if optimizer == "adafactor":  # factored second moment (row + column) of matrices, no first moment,
        total = 4 * len(trainable)  # and the parameter's RMS, a float32 scalar tensor
        for p in trainable:
            shape = _shard_shape(p.shape, shards)
            if len(shape) >= 2:
                total += (math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]) * p.itemsize
            else:
                total += p.shard_numel(shards) * p.itemsize
        return total
    raise ValueError(f"unknown optimizer {optimizer!r}")


def _shard_shape(shape: tuple[int, ...], shards: int) -> tuple[int, ...]:
    return shape if not shape else (math.ceil(shape[0] / shards), *shape[1:])


def layer_activation_bytes(s: Shape, compute: str) -> int:
    """Bytes saved for backward per token by one decoder layer (the table in the module docstring)."""
    ch, ckv, ci, cnh, const, cr = ACTIVATION_COEFFS[(compute, s.lora_targets > 0)]
    table = ch * s.hidden + ckv * s.kv_dim + ci * s.intermediate + cnh * s.heads + const + cr * s.lora_targets
    return table + (s.layer_extra(s, compute) if s.layer_extra is not None else 0)


def outside_activation_bytes(s: Shape, compute: str, checkpointing: bool = False) -> int:
    """Per token, outside the layers: final norm, RoPE tables (cos, sin; under gradient checkpointing only
    the recomputed layer keeps them), input ids."""
    if s.outside is not None:
        return s.outside(s, compute)
    rope = 0 if checkpointing else (4 if compute == "bf16" else 8) * s.head_dim
    return (6 if compute == "bf16" else 8) * s.hidden + rope + 12


def autocast_copies(params: list[Param], checkpointing: bool, layers: int) -> int:
    """Bytes of the bf16 weight copies autocast makes of fp32 Linear weights that are alive when backward
    starts (the backward runs outside the autocast region, so its cache is gone): those saved by their matmul,
    trainable or frozen; under checkpointing the layers save none, and one recomputed layer's exist at a time
    (about 1/``layers`` of them), beside the ones outside the layers (the output head)."""
    copies = [p for p in params if p.linear and p.itemsize == 4]
    inside = sum(2 * p.numel for p in copies if p.in_layer)
    outside = sum(2 * p.numel for p in copies if not p.in_layer)
    return outside + (inside // max(1, layers) if checkpointing else inside)


def offloaded_activation_bytes(s: Shape, tokens: int, compute: str) -> int:
    """Bytes of the layer inputs gradient checkpointing keeps for a micro-batch of ``tokens`` tokens (the
    residual stream at each layer boundary: 2 bytes x hidden per token under pure bf16, 4 otherwise): what
    ``train.activation_offload`` holds in host memory (pinned on CUDA) instead of on the GPU."""
    residual = 2 if compute == "bf16" else 4
    return tokens * s.layers * residual * s.hidden


def activation_bytes(s: Shape, tokens: int, compute: str, checkpointing: bool, autocast_copies: int = 0,
                     at_loss: bool = False, offload: bool = False) -> int:
    """Activations of a micro-batch of ``tokens`` tokens (without the logits); ``autocast_copies`` bytes of
    bf16 weight copies that autocast keeps (0 unless compute is autocast). ``at_loss``: what is alive when
    the loss is backpropagated (under checkpointing, before any layer is recomputed). ``offload`` (with
    ``checkpointing``): the layer inputs are in host memory but the recomputed layer's."""
    per_layer = layer_activation_bytes(s, compute)
    if checkpointing:  # every layer keeps its input; one layer is recomputed at a time in backward
        residual = 2 if compute == "bf16" else 4
        kept = (0 if at_loss else 1) if offload else s.layers
        layers = kept * residual * s.hidden + (0 if at_loss else per_layer)
    else:
        layers = s.layers * per_layer
    return tokens * (layers + outside_activation_bytes(s, compute, checkpointing)) + autocast_copies


def logits_bytes(vocab: int, tokens: int, peak: bool = True) -> int:
    """The loss' share: saved fp32 log-softmax (``peak=False``) or its backward peak (12 x vocab per token)."""
    return (LOGITS_PEAK_PER_VOCAB if peak else LOGITS_SAVED_PER_VOCAB) * vocab * tokens


def chunked_logits_bytes(vocab: int, tokens: int, chunk: int, compute: str) -> int:
    """The chunked loss' share (``train.chunked_loss``, :mod:`voxrelay.models.linear_ce`): one chunk's logits, fp32
    (4 x vocab per token, turned into the softmax and its gradient in place) and, under bf16/autocast, the head's
    own low-precision output beside it for a moment (2 more); nothing per token of the whole batch but a few
    float32 vectors (measured: tests/unit/test_plan_peak.py's chunked rows)."""
    per_vocab = LOGITS_CHUNK_PER_VOCAB + (0 if compute == "fp32" else 2)
    return per_vocab * vocab * min(tokens, chunk) + 8 * tokens


def overhead_bytes(allocated: int) -> int:
    return int(OVERHEAD_FIXED + FRAGMENTATION * allocated)
