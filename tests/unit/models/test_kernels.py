"""train.kernels: the fused RMSNorm and SwiGLU stand in for every norm and MLP of a Llama decoder (found on CPU
too), are picked only on CUDA with Liger-Kernel installed, and on a GPU give the plain forward and backward."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from voxrelay.models import kernels

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(LlamaConfig(**TINY), attn_implementation="sdpa")


def test_every_norm_and_mlp_of_a_llama_is_found() -> None:
    found = kernels.fusable(_llama())
    # two per layer (input, post-attention) and the final norm; one MLP per layer
    assert len(found["RMSNorm"]) == 2 * 2 + 1 and len(found["SwiGLU"]) == 2
    gelu = LlamaForCausalLM._from_config(LlamaConfig(**TINY, hidden_act="gelu"))
    assert kernels.fusable(gelu)["SwiGLU"] == []  # a GELU MLP is not a SwiGLU


def test_off_cuda_the_plain_kernels_stay() -> None:
    module = _llama()
    assert kernels.fuse(module, "cpu") == {}
    assert all("forward" not in vars(m) for m in module.modules())  # no instance's forward replaced


@pytest.mark.skipif(not kernels.available("cuda" if torch.cuda.is_available() else "cpu"),
                    reason="Liger-Kernel's Triton kernels need CUDA and `pip install 'voxrelay[kernels]'`")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_kernels_equal_the_plain_ones_on_a_gpu(dtype: torch.dtype) -> None:
    plain = _llama().to("cuda", dtype)
    fused = copy.deepcopy(plain)
    assert kernels.fuse(fused, "cuda") == {"RMSNorm": 5, "SwiGLU": 2}
    ids = torch.randint(0, 97, (2, 33), device="cuda")
    outs = []
    for module in (plain, fused):
        logits = module(input_ids=ids).logits.float()
        logits.logsumexp(-1).sum().backward()
        outs.append((logits, {n: p.grad.float() for n, p in module.named_parameters()}))
    (a, ga), (b, gb) = outs
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert float((a - b).abs().max() / a.abs().max()) <= tol
    for name, g in ga.items():
        assert float((gb[name] - g).abs().max() / g.abs().max().clamp_min(1e-12)) <= tol, name
