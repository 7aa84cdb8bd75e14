"""``train.activation_offload``: under gradient checkpointing, the tensors each checkpointed layer keeps until
its recompute (its positional inputs: the residual stream at the layer boundary, [B, T, hidden]) wait in host
memory, pinned where CUDA is available, and come back to the device when backward recomputes that layer.

Only the boundary tensors move. :func:`offload_checkpoints` runs each call of the checkpoint function that
transformers sets on a checkpointing layer (``_gradient_checkpointing_func``, the hook its
``GradientCheckpointingLayer`` documents) inside :class:`ActivationOffload`'s saved-tensor hooks. Inside that
call torch's non-reentrant checkpoint first saves the layer's inputs (through the current hooks: ours), then
enters its own hooks for the layer's body; the innermost hooks win, so what the layer saves inside is the
checkpoint's recompute handle and never reaches ours (it is recomputed anyway). Tensors given to the layer by
keyword (the attention mask, RoPE's cos/sin: one per model, shared by every layer) stay where they are, and so
does what is saved outside the layers (embeddings, final norm, loss). ``voxrelay plan`` prices the moved bytes
with :func:`voxrelay.plan.formulas.offloaded_activation_bytes`.

Numerics are unchanged: a copy to the host and back is exact, and the recompute replays the same RNG state.
On a CPU the host is the device: the hooks see every boundary tensor and hand it back as it is (no bytes move).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

_INNER = "_voxrelay_checkpoint"  # the checkpoint function a wrapper runs (so a second install replaces, not nests)


def pin_host_memory() -> bool:
    """Pinned host buffers where CUDA is available (the device-to-host copies run at full PCIe speed and the
    copies back can overlap compute); plain host memory otherwise (pinning needs a CUDA driver)."""
    return torch.cuda.is_available()


class ActivationOffload(torch.autograd.graph.saved_tensors_hooks):
    """Saved-tensor hooks that keep a saved tensor in host memory until backward unpacks it.

    ``packed_bytes`` / ``unpacked_bytes``: bytes that went through each hook so far (what was, or on a GPU
    would be, copied to the host and back)."""

    def __init__(self, pin_memory: bool) -> None:
        self.pin_memory = pin_memory
        self.packed_bytes = 0
        self.unpacked_bytes = 0
        super().__init__(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
        self.packed_bytes += tensor.numel() * tensor.element_size()
        return tensor.device, self.to_host(tensor)

    def _unpack(self, packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
        device, host = packed
        self.unpacked_bytes += host.numel() * host.element_size()
        return self.to_device(host, device)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of ``tensor`` (``tensor`` itself when it is in host memory already)."""
        if tensor.device.type == "cpu":
            return tensor
        if not self.pin_memory:
            return tensor.to("cpu")
        # as torch.autograd.graph.save_on_cpu: a blocking copy into a pinned buffer, so the device tensor may
        # be freed as soon as the forward drops it
        host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=True)
        host.copy_(tensor)
        return host

    def to_device(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``host`` back on ``device``; from pinned memory without blocking (stream-ordered before its use)."""
        return host.to(device, non_blocking=self.pin_memory)


def _inside(hooks: ActivationOffload, checkpoint: Callable) -> Callable:
    def offloaded_checkpoint(function, *args, **kwargs):
        with hooks:
            return checkpoint(function, *args, **kwargs)

    setattr(offloaded_checkpoint, _INNER, checkpoint)
    return offloaded_checkpoint


def offload_checkpoints(module: torch.nn.Module, hooks: ActivationOffload) -> int:
    """Run every checkpointed layer of ``module`` (gradient checkpointing already on) inside ``hooks``; returns
    how many modules now offload. Installing again replaces the hooks (e.g. a measurement's own)."""
    count = 0
    for sub in module.modules():
        checkpoint = getattr(sub, "_gradient_checkpointing_func", None)
        if checkpoint is None or not getattr(sub, "gradient_checkpointing", False):
            continue
        sub._gradient_checkpointing_func = _inside(hooks, getattr(checkpoint, _INNER, checkpoint))
        count += 1
    return count


def offloads(module: torch.nn.Module) -> bool:
    """True when some checkpointed layer of ``module`` runs under :func:`offload_checkpoints`' hooks."""
    return any(hasattr(getattr(sub, "_gradient_checkpointing_func", None), _INNER) for sub in module.modules())
