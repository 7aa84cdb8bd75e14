"""Fused GPU kernels for a Llama-style decoder's layers (``train.kernels``): Liger-Kernel's Triton RMSNorm and
SwiGLU (``pip install 'voxrelay[kernels]'``) in place of transformers' own, on CUDA.

Only the module instances are changed (their ``forward``): nothing global is patched, parameter names and
checkpoints stay as they are, and a LoRA adapter on the MLP's projections keeps working (the fused forward
calls them). Each RMSNorm keeps Llama's casting (variance in float32, the weight times the input's dtype) and
each MLP its SiLU gate. The output head's loss has its own kernel choice (:mod:`voxrelay.models.linear_ce`).
GPU tests compare the fused and plain forward and backward (``tests/unit/models/test_kernels.py``).
"""

from __future__ import annotations

import importlib.util
import logging
import types

import torch

log = logging.getLogger(__name__)


def available(device_type: str) -> bool:
    """Whether the fused kernels can run: a CUDA device with liger_kernel and triton importable."""
    return device_type == "cuda" and all(importlib.util.find_spec(m) is not None for m in ("liger_kernel", "triton"))


def _rms_norm(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    return LigerRMSNormFunction.apply(hidden_states, self.weight, self.variance_epsilon, 0.0, "llama", True, None)


def _swiglu(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return self.down_proj(LigerSiLUMulFunction.apply(self.gate_proj(x), self.up_proj(x)))


# the transformers classes whose forward is exactly what the fused kernels compute (Liger uses the same in-place
# "llama" casting for them); other RMSNorms differ (an offset, a residual add sharing the gradient) and stay plain
NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm")
MLPS = ("LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP")


def fusable(module: torch.nn.Module) -> dict[str, list[torch.nn.Module]]:
    """The submodules the fused kernels stand in for: the RMSNorms of :data:`NORMS` and the MLPs of :data:`MLPS`
    whose activation is SiLU."""
    found: dict[str, list[torch.nn.Module]] = {"RMSNorm": [], "SwiGLU": []}
    for m in module.modules():
        name = type(m).__name__
        if name in NORMS:
            found["RMSNorm"].append(m)
        elif name in MLPS and "silu" in type(getattr(m, "act_fn", None)).__name__.lower():
            found["SwiGLU"].append(m)
    return found


def fuse(module: torch.nn.Module, device_type: str, setting: str = "auto") -> dict[str, int]:
    """Switch ``module``'s RMSNorms and SwiGLU MLPs to the fused kernels where :func:`available` (``setting``
    ``auto``); returns how many of each were switched (empty: the plain kernels)."""
    if setting != "auto" or not available(device_type):
        return {}
    counts = {}
    for kind, modules in fusable(module).items():
        for m in modules:
            m.forward = types.MethodType(_rms_norm if kind == "RMSNorm" else _swiglu, m)
        if modules:
            counts[kind] = len(modules)
    return counts
