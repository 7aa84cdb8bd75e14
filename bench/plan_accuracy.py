"""How close ``voxrelay plan``'s formulas are to what torch really allocates.

CPU (always): small Llama decoders (the families' architecture) in pure bf16, autocast and fp32; predicted
activation bytes vs the bytes of the tensors autograd saves (``saved_tensors_hooks``, distinct storages,
parameters excluded), plus the family loss (logits' fp32 log-softmax) of a small codec_lm.
CUDA (when available): a few layers of Orpheus-3B's width (hidden 3072, MLP 8192, 24/8 heads, vocab
156,940), fp32 master weights under bf16 autocast + AdamW (voxrelay's DDP path), one micro-batch of
``--tokens`` tokens: the plan's total without overhead vs ``torch.cuda.max_memory_allocated``.

The last line is ``ratio <predicted/measured>`` (CUDA's when it ran, else the CPU total's).

    PYTHONPATH=src python bench/plan_accuracy.py [--tokens 2048] [--layers 4]
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from voxrelay.plan.formulas import activation_bytes, grad_bytes, logits_bytes, optimizer_bytes, weight_bytes
from voxrelay.plan.model import collect, shape_of

COMPUTE = {"bf16": (torch.bfloat16, contextlib.nullcontext),
           "autocast": (torch.float32, lambda: torch.autocast("cpu", dtype=torch.bfloat16)),
           "fp32": (torch.float32, contextlib.nullcontext)}


def llama(h: int, i: int, nh: int, kv: int, layers: int, vocab: int, dtype: torch.dtype, device: str = "cpu"):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=h, intermediate_size=i, num_hidden_layers=layers,
                         num_attention_heads=nh, num_key_value_heads=kv, tie_word_embeddings=True)
    with torch.device(device):
        return LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=dtype)


def saved_bytes(module: torch.nn.Module, fn) -> int:
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(n for ptr, n in seen.items() if ptr not in params)


def cpu_rows(tokens: int = 256) -> tuple[int, int]:
    total_pred = total_meas = 0
    for compute, (dtype, ctx) in COMPUTE.items():
        for h, i, nh, kv in [(256, 512, 4, 2), (512, 1536, 8, 2)]:
            module = llama(h, i, nh, kv, 4, 1000, dtype)
            ids = torch.randint(0, 1000, (1, tokens))
            with ctx():
                measured = saved_bytes(module, lambda m=module, x=ids: m.model(input_ids=x, use_cache=False))
            copies = sum(2 * m.weight.numel() for m in module.model.modules()
                         if isinstance(m, torch.nn.Linear)) if compute == "autocast" else 0
            predicted = activation_bytes(shape_of(module), tokens, compute, False, copies)
            print(f"cpu {compute:8s} h={h:4d} I={i:5d} layers=4 tokens={tokens}: predicted {predicted / 1e6:8.2f} MB "
                  f"measured {measured / 1e6:8.2f} MB  ratio {predicted / measured:.3f}")
            total_pred, total_meas = total_pred + predicted, total_meas + measured
    return total_pred, total_meas


def cpu_loss_row(tokens: int = 256) -> tuple[int, int]:
    """The codec_lm family's loss end to end (head + cross-entropy included), fp32."""
    from voxrelay.config import load_config
    from voxrelay.models.base import DataSpec
    from voxrelay.models.registry import build_model

    cfg = load_config(None, ["model.hidden_size=128", "model.num_layers=2", "model.num_heads=2",
                             "model.intermediate_size=384"])
    model = build_model(cfg.model, DataSpec(4, 256), 0)
    ids = torch.randint(0, 300, (2, tokens // 2))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    measured = saved_bytes(model.module, lambda: model.loss(model.module, batch))
    shape = shape_of(model.module)
    predicted = activation_bytes(shape, tokens, "fp32", False) + logits_bytes(shape.vocab, tokens - 2, peak=False)
    print(f"cpu codec_lm loss (vocab {shape.vocab}) tokens={tokens}: predicted {predicted / 1e6:.2f} MB measured "
          f"{measured / 1e6:.2f} MB  ratio {predicted / measured:.3f}")
    return predicted, measured


def cuda_row(tokens: int, layers: int) -> float:
    module = llama(3072, 8192, 24, 8, layers, 156_940, torch.float32, "cuda")
    params, _ = collect(module, ())
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-5)
    ids = torch.randint(0, 156_940, (1, tokens), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = module(input_ids=ids, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the optimizer's states exist from here on, as in training
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    measured = torch.cuda.max_memory_allocated()
    copies = sum(2 * p.numel for p in params if p.linear)
    predicted = (weight_bytes(params) + grad_bytes(params) + optimizer_bytes(params, "adamw")
                 + activation_bytes(shape_of(module), tokens, "autocast", False, copies)
                 + logits_bytes(156_940, tokens))
    print(f"cuda Orpheus-3B width, {layers} layers, fp32 weights + bf16 autocast + AdamW, {tokens} tokens: "
          f"predicted {predicted / 1e9:.2f} GB, max_memory_allocated {measured / 1e9:.2f} GB")
    return predicted / measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048, help="tokens of the CUDA micro-batch")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the CUDA model")
    args = parser.parse_args()
    torch.manual_seed(0)
    pred, meas = cpu_rows()
    loss_pred, loss_meas = cpu_loss_row()
    ratio = (pred + loss_pred) / (meas + loss_meas)
    print(f"cpu total: predicted/measured {ratio:.3f}")
    if torch.cuda.is_available():
        ratio = cuda_row(args.tokens, args.layers)
    else:
        print("cuda: not available, skipped")
    print(f"ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
