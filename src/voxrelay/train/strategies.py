"""Strategies applied to a built model before the loop sees it; the loop has no strategy branches: it
trains whatever ``model.module`` has become and the parameters that still require a gradient.

What a checkpoint holds of a model with frozen parts is :mod:`voxrelay.checkpoint.frozen`'s rule (re-exported here).

LoRA (peft, :mod:`voxrelay.models.lora`, re-exported here): :func:`apply_lora` wraps ``model.module`` in a
``PeftModel`` with the family's defaults for every ``train.lora`` key left unset; the base stays frozen.

Gradient checkpointing (:func:`enable_gradient_checkpointing`) is transformers' own, non-reentrant.
FSDP2 (:func:`apply_fsdp`, ``train.strategy=fsdp``) shards the module in place after LoRA; its checkpoints
are saved and loaded by :mod:`voxrelay.checkpoint.shard_saver`. DDP is accelerate's ``prepare``
(:func:`voxrelay.train.build.wrap_model`).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch

from voxrelay.checkpoint.frozen import (  # noqa: F401 (re-exported)
    BaseModelChangedError,
    base_hash,
    check_base,
    describe_base,
    has_frozen,
    load_trainable,
    trainable_state,
)
from voxrelay.config import ConfigError
from voxrelay.models.linear_ce import choose_loss  # noqa: F401 (re-exported: the loss kernel is a strategy too)
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


def layer_options(model: FamilyModel, tc: Any, device_type: str) -> None:
    """What the train section asks of the decoder layers, in this order: gradient checkpointing (and activation
    offload), fused kernels, then compilation (it compiles the layers as the others left them)."""
    enable_gradient_checkpointing(model, tc.gradient_checkpointing, tc.activation_offload)
    fuse_kernels(model, tc.kernels, device_type)
    compile_layers(model, tc.compile)


def fuse_kernels(model: FamilyModel, setting: str, device_type: str) -> dict[str, int]:
    """``train.kernels``: Liger-Kernel's fused RMSNorm and SwiGLU on CUDA where installed (``auto``), said in the
    run's first lines either way on a GPU."""
    from voxrelay.models.kernels import fuse

    fused = fuse(model.module, device_type, setting)
    if fused:
        log.info("fused kernels (Liger-Kernel, Triton): %s", ", ".join(f"{k} x{n}" for k, n in fused.items()))
    elif device_type == "cuda":
        log.info("plain kernels for the layers (%s)", "train.kernels=plain" if setting == "plain" else
                 "`pip install 'voxrelay[kernels]'` for Liger-Kernel's fused RMSNorm and SwiGLU")
    return fused


def compile_layers(model: FamilyModel, on: bool) -> int:
    """``train.compile``: ``torch.compile`` each decoder layer in place (regional compilation, torchtitan's way:
    one layer's code compiled once and reused by the others; parameter names, checkpoints and FSDP units as
    without it). Returns how many layers were compiled."""
    if not on:
        return 0
    classes = model.fsdp_layer_classes()
    layers = [m for m in model.module.modules() if classes and isinstance(m, classes)]
    if not layers:
        raise StrategyError(f"train.compile=true: the {model.family} model declares no layer class to compile "
                            "(fsdp_layer_classes); set train.compile=false")
    for layer in layers:
        layer.compile()
    log.info("torch.compile on: %d %s layers compiled on first use (the first steps take longer)", len(layers),
             type(layers[0]).__name__)
    return len(layers)


def _offload_activations(model: FamilyModel) -> None:
    from voxrelay.train.offload import ActivationOffload, offload_checkpoints, pin_host_memory

    pinned = pin_host_memory()
    if not offload_checkpoints(model.module, ActivationOffload(pinned)):
        raise StrategyError(f"train.activation_offload=true: the {model.family} model checkpoints no layer through "
                            "transformers' checkpoint function, so there is nothing to offload; set "
                            "train.activation_offload=false")
    log.info("activation offload on: each checkpointed layer's input waits in %s until its recompute",
             "pinned host memory" if pinned else "host memory (a CPU run: where it already was)")


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
