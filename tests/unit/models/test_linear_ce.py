"""The chunked linear cross-entropy (voxrelay.models.linear_ce) against the materialised loss: values and gradients
within 1e-5 (fp32) on ignored rows, chunks that do not divide the tokens, a bias, a tied embedding/head and bf16
autocast; its peak of live tensors; the kernel choice (the CUDA kernel cannot run here: no GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.peak import Peak
from voxrelay.models.linear_ce import (
    CHUNKED,
    LIGER,
    MATERIALISED,
    head_loss,
    head_parts,
    linear_cross_entropy,
    pick_kernel,
)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max() / b.detach().abs().max().clamp_min(1e-30))


def _inputs(n: int = 53, h: int = 24, v: int = 211, seed: int = 0, bias: bool = True):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.3).requires_grad_()
    b = (torch.randn(v, generator=g) * 0.1).requires_grad_() if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    targets[::4] = -100  # ignored rows, some at chunk boundaries
    return hidden, weight, b, targets


def _grads(loss: torch.Tensor, *tensors: torch.Tensor | None) -> list[torch.Tensor]:
    present = [t for t in tensors if t is not None]
    return list(torch.autograd.grad(loss, present))


@pytest.mark.parametrize("chunk", [1, 7, 16, 53, 500])  # 7 and 16 do not divide 53 tokens
def test_values_and_gradients_equal_the_materialised_loss_in_fp32(chunk: int) -> None:
    hidden, weight, bias, targets = _inputs()
    reference = F.cross_entropy(F.linear(hidden, weight, bias), targets, reduction="none")
    count = (targets != -100).sum()
    want = _grads(reference.sum() / count, hidden, weight, bias)  # the loop divides the sum by the count
    total, per_token = linear_cross_entropy(hidden, weight, bias, targets, chunk)
    got = _grads(total / count, hidden, weight, bias)
    assert _rel(total, reference.sum()) <= 1e-5
    assert _rel(per_token, reference.detach()) <= 1e-5 and (per_token[targets == -100] == 0).all()
    for g, w in zip(got, want, strict=True):
        assert _rel(g, w) <= 1e-5
    assert got[0][targets == -100].abs().max() == 0  # an ignored row gets no gradient


def test_a_tied_embedding_and_head_gets_both_gradients() -> None:
    torch.manual_seed(1)
    table = torch.nn.Parameter(torch.randn(97, 16) * 0.2)
    ids = torch.randint(0, 97, (40,))
    targets = torch.roll(ids, -1)
    targets[-3:] = -100

    def run(chunked: bool) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.tanh(F.embedding(ids, table) * 3)  # the input embedding, then "the model"
        if chunked:
            loss = linear_cross_entropy(hidden, table, None, targets, 9)[0]
        else:
            loss = F.cross_entropy(F.linear(hidden, table), targets, reduction="sum")
        return loss, torch.autograd.grad(loss, table)[0]

    (chunked, g_chunked), (whole, g_whole) = run(True), run(False)
    assert _rel(chunked, whole) <= 1e-5 and _rel(g_chunked, g_whole) <= 1e-5


@pytest.mark.parametrize("trained", [True, False])  # a frozen fp32 head is cast once for every chunk
def test_under_bf16_autocast_it_matches_the_materialised_loss_to_bf16_rounding(trained: bool) -> None:
    """accelerate's bf16: fp32 weights and hidden states, the head's matmuls in bf16, the softmax in fp32. The
    chunked loss computes the logits the same way (equal values) and its gradients' matmuls in bf16 too, summed
    over chunks in fp32: within bf16's rounding."""
    hidden, weight, _, targets = _inputs(n=64, h=32, v=301, bias=False)
    weight.requires_grad_(trained)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = F.cross_entropy(F.linear(hidden, weight).float(), targets, reduction="sum")
        total, _ = linear_cross_entropy(hidden, weight, None, targets, 10)
    head = weight if trained else None
    want, got = _grads(reference, hidden, head), _grads(total, hidden, head)
    assert total.dtype == torch.float32 and len(got) == 1 + trained
    assert _rel(total, reference) <= 1e-5  # the same bf16 logits, the same fp32 softmax
    for g, w in zip(got, want, strict=True):  # measured: 8e-4 (hidden), 3e-3 (weight)
        assert g.dtype == torch.float32 and _rel(g, w) <= 1e-2


def test_the_peak_of_live_tensors_is_a_chunk_not_the_logits() -> None:
    """1,024 tokens over a 4,096-way head: the materialised loss holds 12 bytes x vocab per token at its peak
    (16 MB here); 64-token chunks hold one fp32 chunk of logits at a time (1 MB) beside the gradients."""
    n, h, v, chunk = 1024, 32, 4096, 64
    hidden, weight, _, targets = _inputs(n=n, h=h, v=v, bias=False)

    def peak(chunked: bool) -> int:
        p = Peak()
        p.adopt([hidden, weight, targets])
        with p:
            if chunked:
                loss = linear_cross_entropy(hidden, weight, None, targets, chunk)[0]
            else:
                loss = F.cross_entropy(F.linear(hidden, weight), targets, reduction="sum")
            grads = torch.autograd.grad(loss, [hidden, weight])
        del grads, loss
        return p.peak - 4 * (n * h + v * h) - 8 * n  # above the inputs

    grads = 4 * (n * h + v * h)  # what any backward leaves: d hidden and d weight
    materialised, chunked = peak(False), peak(True)
    assert materialised >= 12 * v * n
    assert chunked - grads <= 4 * v * chunk + 4 * v * n // 16  # one chunk's fp32 logits (+ small vectors)
    assert chunked <= 0.25 * materialised


def test_evaluation_under_no_grad_makes_no_gradient() -> None:
    """needs_input_grad still says True under no_grad: the head's gradient (4 MB here) must not be made."""
    hidden, weight, _, targets = _inputs(n=64, h=256, v=4096, bias=False)
    p = Peak()
    p.adopt([hidden, weight, targets])
    base = p.now
    with p, torch.no_grad():
        total, _ = linear_cross_entropy(hidden, weight, None, targets, 16)
    assert p.peak - base <= 4 * 4096 * 16 + 64 * 64  # one chunk's logits, a few vectors
    reference = F.cross_entropy(F.linear(hidden, weight), targets, reduction="sum")
    assert not total.requires_grad and _rel(total, reference) <= 1e-5


def test_head_loss_finds_the_weight_through_peft_and_falls_back_for_a_head_it_does_not_know() -> None:
    import peft

    torch.manual_seed(2)
    hidden, _, _, targets = _inputs(n=30, h=16, v=50, bias=False)
    hidden = hidden.detach()
    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 50))
    reference = F.cross_entropy(net(hidden), targets, reduction="sum")
    saved = peft.get_peft_model(net, peft.LoraConfig(r=2, target_modules=["0"], modules_to_save=["1"]))
    head = saved.base_model.model[1]  # a ModulesToSaveWrapper: its trained copy is what the forward uses
    weight, _ = head_parts(head)
    assert weight is head.modules_to_save["default"].weight
    inner = saved.base_model.model[0](hidden)
    assert _rel(head_loss(inner, head, targets, CHUNKED, 8).total, reference) <= 1e-5
    lora_head = peft.get_peft_model(torch.nn.Sequential(torch.nn.Linear(16, 50)),
                                    peft.LoraConfig(r=2, target_modules=["0"])).base_model.model[0]
    assert head_parts(lora_head) is None  # a LoRA'd head: the logits are materialised, still right
    out = head_loss(hidden, lora_head, targets, CHUNKED, 8, split=targets > 20)
    losses = F.cross_entropy(lora_head(hidden), targets, reduction="none")
    assert _rel(out.total, losses.sum()) <= 1e-6 and _rel(out.split, losses[targets > 20].sum()) <= 1e-6


def test_the_split_is_the_part_of_the_sum_over_its_rows() -> None:
    hidden, weight, _, targets = _inputs(bias=False)
    head = torch.nn.Linear(24, 211, bias=False)
    head.weight = torch.nn.Parameter(weight.detach())
    split = torch.arange(53) % 3 == 0
    out = head_loss(hidden, head, targets, CHUNKED, 10, split)
    losses = F.cross_entropy(head(hidden), targets, reduction="none")
    assert _rel(out.split, losses[split].sum()) <= 1e-5 and not out.split.requires_grad


def test_the_kernel_is_chosen_by_device_and_what_is_installed() -> None:
    assert pick_kernel("cpu", True) == CHUNKED  # this machine: the portable path
    assert pick_kernel("cpu", True, liger_importable=True) == CHUNKED  # Triton kernels are CUDA only
    assert pick_kernel("cuda", True, liger_importable=True) == LIGER
    assert pick_kernel("cuda", True, liger_importable=False) == CHUNKED
    assert pick_kernel("cuda", False, liger_importable=True) == MATERIALISED
    # what is importable here decides on its own (liger_kernel and triton are not installed on this machine)
    import importlib.util

    here = all(importlib.util.find_spec(m) is not None for m in ("liger_kernel", "triton"))
    assert pick_kernel("cuda", True) == (LIGER if here else CHUNKED)


@pytest.mark.skipif(not torch.cuda.is_available() or pick_kernel("cuda", True) != LIGER,
                    reason="Liger-Kernel's Triton kernel needs CUDA and `pip install 'voxrelay[kernels]'`")
def test_the_cuda_kernel_agrees_with_the_portable_path() -> None:
    hidden, weight, _, targets = _inputs(n=300, h=64, v=5000, bias=False)
    hidden, weight, targets = hidden.detach().cuda().requires_grad_(), weight.detach().cuda(), targets.cuda()
    head = torch.nn.Linear(64, 5000, bias=False, device="cuda")
    head.weight = torch.nn.Parameter(weight)
    split = targets % 2 == 0
    fused, portable = (head_loss(hidden, head, targets, k, 64, split) for k in (LIGER, CHUNKED))
    assert _rel(fused.total, portable.total) <= 1e-4 and _rel(fused.split, portable.split) <= 1e-4
    assert _rel(_grads(fused.total, hidden, head.weight)[1], _grads(portable.total, hidden, head.weight)[1]) <= 1e-3
