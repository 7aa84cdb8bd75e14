"""Strategies applied to a built model before the loop sees it; the loop has no strategy branches: it
trains whatever ``model.module`` has become and the parameters that still require a gradient.

What a checkpoint holds, by rule: the trainable tensors only (:func:`trainable_state`) whenever some
part of the model is frozen — a LoRA base, or a part the family freezes (a text encoder) — plus
:func:`base_hash` of the model as built, which resume, synthesis and export compare with the model
they rebuild from its source (:func:`check_base`): trained weights on another base would load without
error and be silently wrong. Frozen parts are never copied into each checkpoint.

LoRA (peft, :mod:`voxrelay.models.lora`, re-exported here): :func:`apply_lora` wraps ``model.module`` in a
``PeftModel`` with the family's defaults for every ``train.lora`` key left unset; the base stays frozen.

Gradient checkpointing (:func:`enable_gradient_checkpointing`) is transformers' own, non-reentrant.
FSDP2 (:func:`apply_fsdp`, ``train.strategy=fsdp``) shards the module in place after LoRA; its checkpoints
are in :mod:`voxrelay.train.sharded`. DDP is accelerate's ``prepare`` (:func:`voxrelay.train.build.wrap_model`).
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import TYPE_CHECKING

import torch

from voxrelay.checkpoint.store import CheckpointError
from voxrelay.config import ConfigError
from voxrelay.errors import UserError
from voxrelay.models.lora import (  # noqa: F401 (re-exported: LoRA is one of the strategies applied before the loop)
    LoraSettingsError,
    apply_lora,
    lora_settings,
    quiet_peft,
    ties_embeddings,
)

if TYPE_CHECKING:
    from voxrelay.models.base import FamilyModel

log = logging.getLogger(__name__)

# base_hash reads this many evenly spaced elements of each tensor, plus a sum over all of them
HASH_SAMPLE = 4096
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class BaseModelChangedError(UserError, ValueError):
    """LoRA weights meet a base model other than the one they were trained on."""


def has_frozen(module: torch.nn.Module) -> bool:
    """True when some parameter of ``module`` does not train (a part the family froze)."""
    return any(not p.requires_grad for p in module.parameters())


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that train (adapters and modules_to_save copies), by their names in ``module``;
    a tied pair appears once."""
    return {name: p for name, p in module.named_parameters() if p.requires_grad}


def load_trainable(module: torch.nn.Module, weights: dict[str, torch.Tensor], where: str) -> None:
    """Load a :func:`trainable_state` into ``module`` whose frozen base is already in place; refuse a
    state that lacks a trainable tensor or holds one this module does not train."""
    expected = trainable_state(module).keys()
    missing, unexpected = sorted(expected - weights.keys()), sorted(weights.keys() - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"{where} does not hold the trained weights of this model: {len(missing)} trained tensors missing "
            f"(e.g. {missing[:2]}), {len(unexpected)} not trained here (e.g. {unexpected[:2]}); it was written "
            "with other train.lora or model settings (e.g. which parts are frozen): use the settings of the run "
            "that wrote it"
        )
    module.load_state_dict(weights, strict=False)


def base_hash(module: torch.nn.Module) -> str:
    """A fingerprint (16 hex digits) of every tensor of ``module.state_dict()``: call it on the family's
    module as built, before :func:`apply_lora`.

    sha256 over each tensor's name, shape, dtype, the sum of its bytes read as 64-bit words (every element
    counts: catches a base that differs in a few weights only, e.g. some rows of an embedding) and
    ``HASH_SAMPLE`` evenly spaced elements (catches reordered weights, which a sum misses). Both are
    exact integer arithmetic (the sum wraps modulo 2**64 in any order), so CPU and GPU give the same
    hash; the sum runs where the tensor lives and only the sample crosses to the CPU. Measured on 2 CPU
    threads: 0.1 s per 1B bf16 weights, ~20x less than a sha256 of all the bytes (1.2 s).
    """
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        raw = flat.view(torch.uint8)
        if raw.storage_offset() % 8:  # a view into a shared buffer, not 8-byte aligned: words need a copy
            raw = raw.clone()
        whole = raw.numel() // 8 * 8
        total = int(raw[:whole].view(torch.int64).sum()) + int(raw[whole:].sum())
        sample = flat.view(_INT_OF_SIZE[flat.element_size()])[:: max(1, flat.numel() // HASH_SAMPLE)]
        h.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|{total}|".encode() + sample.cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def describe_base(model_cfg, seed: int) -> str:
    """How the run's config says to build the base: ``model.init_from=...`` or the seeded random init."""
    init_from = model_cfg.pretrained()
    return f"model.init_from={init_from!r}" if init_from else f"the random init of train.seed={seed}"


def check_base(saved: str | None, current: str, base: str, what: str, fix: str) -> None:
    """Raise :class:`BaseModelChangedError` when the base hash the trained weights (LoRA adapters, or the
    parts beside frozen ones) were trained on (``saved``) differs from the one of the model just built from
    ``base`` (see :func:`describe_base`)."""
    if saved != current:
        raise BaseModelChangedError(
            f"{what}: its trained weights were saved over a base model with weights hash {saved}, but {base} now "
            f"gives a base with hash {current} (other weights behind the same name: a re-saved folder, a hub id "
            f"that moved to a new revision, another library version's random init); {fix}"
        )


class StrategyError(ConfigError):
    """A train.strategy setting does not fit this model or machine."""


def enable_gradient_checkpointing(model: FamilyModel, on: bool, offload: bool = False) -> None:
    """``train.gradient_checkpointing``: transformers' own per-layer recomputation. Non-reentrant, so it works
    with frozen inputs (LoRA), under DDP and inside FSDP2 units, and replays each layer's dropout masks
    (the RNG state is saved and restored around the recomputation). ``offload``
    (``train.activation_offload``): the layer inputs it keeps wait in host memory (:mod:`voxrelay.train.offload`)."""
    if not on:
        return
    # transformers 5 renamed it (the old name warns); both take the kwargs of torch.utils.checkpoint
    if hasattr(model.module, "activation_checkpointing_enable"):
        model.module.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(model.module, "gradient_checkpointing_enable"):
        model.module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        raise StrategyError(f"train.gradient_checkpointing=true: the {model.family} model has no "
                            "activation_checkpointing_enable (not a transformers model); set it to false")
    log.info("gradient checkpointing on: each layer's activations are recomputed in backward")
    if offload:
        _offload_activations(model)


def _offload_activations(model: FamilyModel) -> None:
    from voxrelay.train.offload import ActivationOffload, offload_checkpoints, pin_host_memory

    pinned = pin_host_memory()
    if not offload_checkpoints(model.module, ActivationOffload(pinned)):
        raise StrategyError(f"train.activation_offload=true: the {model.family} model checkpoints no layer through "
                            "transformers' checkpoint function, so there is nothing to offload; set "
                            "train.activation_offload=false")
    log.info("activation offload on: each checkpointed layer's input waits in %s until its recompute",
             "pinned host memory" if pinned else "host memory (a CPU run: where it already was)")


def choose_loss(model: FamilyModel, tc, device_type: str, say: bool = True) -> None:
    """``train.chunked_loss``: the kernel of the family's head loss (:func:`voxrelay.models.linear_ce.pick_kernel`:
    Liger-Kernel's on CUDA when installed, else the portable chunked one, or the materialised logits), said in
    the run's first lines (``say``). A family whose loss has no such head (``chunked_heads`` false) keeps its own."""
    from voxrelay.models.linear_ce import describe_kernel, pick_kernel

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


def fsdp_mesh(sharding: str, device_type: str):
    """The device mesh of ``train.fsdp_sharding``: 1-D over every process, or with ``hybrid`` 2-D
    (nodes replicate, the processes of a node shard). On one node hybrid is full_shard."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():  # accelerate sets the group up under a launcher; else: a world of 1
        backend = "nccl" if device_type == "cuda" else "gloo"
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            dist.init_process_group(backend)
        else:  # fully_shard still needs a group
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    world = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if sharding == "hybrid" and world > local:
        if world % local:
            raise StrategyError(f"train.fsdp_sharding=hybrid needs the same number of processes on every node; "
                                f"{world} processes with {local} on this node; use full_shard")
        log.info("FSDP hybrid: %d nodes replicate, %d processes per node shard", world // local, local)
        return init_device_mesh(device_type, (world // local, local), mesh_dim_names=("replicate", "shard"))
    if sharding == "hybrid":
        log.info("FSDP hybrid on one node is full_shard (nothing to replicate across)")
    return init_device_mesh(device_type, (world,))


def apply_fsdp(module: torch.nn.Module, layer_classes: tuple[type[torch.nn.Module], ...], sharding: str,
               precision: str, cpu_offload: bool, mesh, forward_methods: tuple[str, ...] = ()) -> torch.nn.Module:
    """FSDP2: ``fully_shard`` each layer of ``layer_classes`` (a unit gathered just for its own forward and
    backward), then the root (embeddings, head, norms). Parameters stay fp32 (the optimizer's master weights);
    bf16 computes in bf16 and reduces gradients in fp32. ``forward_methods``: methods of the root that run
    like its forward (a family's generation calls them: e.g. encode once, decode per step), so the root's
    parameters are gathered for them too. Returns ``module``, sharded in place."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    if not layer_classes:
        raise StrategyError("train.strategy=fsdp: this model names no layer classes to shard as units; use ddp")
    kwargs: dict = {"mesh": mesh, "reshard_after_forward": sharding != "shard_grad_op"}
    if precision == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    units = [m for m in module.modules() if isinstance(m, layer_classes)]
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(module, **kwargs)
    for name in forward_methods:
        register_fsdp_forward_method(module, name)
    log.info("FSDP2 (our fully_shard code path): %d %s units + root over %d processes, %s, precision %s, "
             "cpu offload %s", len(units), "/".join(c.__name__ for c in layer_classes), mesh.size(), sharding,
             precision, cpu_offload)
    return module
