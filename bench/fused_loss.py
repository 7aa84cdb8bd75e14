"""The chunked linear cross-entropy (``train.chunked_loss``, voxrelay.models.linear_ce) against the materialised
loss on one head, side by side: Orpheus' 156,940-way vocabulary at 2,048 tokens.

For each: the loss phase's peak of live tensor bytes (tests/helpers/peak.py's tracker: forward and backward of
the loss alone, given the final hidden states), above the inputs, and the step time (forward + backward, the
median of ``--repeats`` alternated runs); the values and gradients compared in fp32. Two cases:

- ``frozen head``: the head takes no gradient (LoRA without the head trained in full): the peak is the
  loss' own memory, logits and their gradient;
- ``trained head``: its weight's gradient (4 bytes x vocab x hidden) exists in both, whatever the loss: the
  peak is given with it and, beside it, without it (the loss' own part).

The head's width does not change the logits' bytes (tokens x vocab), only the matmuls' cost and the weight's
gradient: ``--hidden`` defaults to 512 on CPU (Orpheus-3B's 3,072 needs ~8 GB and minutes per step on 2 cores;
pass ``--hidden 3072`` where that is available). On CUDA with Liger-Kernel installed the run would use its kernel
instead; this bench times the portable path on the device it runs on.

    PYTHONPATH=src python bench/fused_loss.py [--tokens 2048] [--vocab 156940] [--hidden 512] [--chunk 256]

The last line is ``ratio <chunked / materialised loss-phase peak, frozen head>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.helpers.peak

from tests.helpers.peak import Peak  # noqa: E402
from voxrelay.models.linear_ce import linear_cross_entropy  # noqa: E402


def materialised(hidden, weight, targets, chunk):
    return F.cross_entropy(F.linear(hidden, weight).float(), targets, reduction="sum")


def chunked(hidden, weight, targets, chunk):
    return linear_cross_entropy(hidden, weight, None, targets, chunk)[0]


def run(loss_fn, hidden, weight, targets, chunk):
    wanted = [t for t in (hidden, weight) if t.requires_grad]
    loss = loss_fn(hidden, weight, targets, chunk)
    return loss.detach(), torch.autograd.grad(loss / 1000.0, wanted)  # the loop divides by a count


def peak(loss_fn, hidden, weight, targets, chunk) -> tuple[int, int]:
    """(peak bytes above the inputs, the bytes of the gradients it returns)."""
    p = Peak()
    p.adopt([hidden, weight, targets])
    base = p.now
    with p:
        _, grads = run(loss_fn, hidden, weight, targets, chunk)
    return p.peak - base, sum(g.numel() * g.element_size() for g in grads)


def seconds(loss_fn, hidden, weight, targets, chunk) -> float:
    sync = torch.cuda.synchronize if hidden.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    run(loss_fn, hidden, weight, targets, chunk)
    sync()
    return time.perf_counter() - start


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def case(name: str, hidden, weight, targets, args) -> float:
    (v_m, g_m), (v_c, g_c) = (run(f, hidden, weight, targets, args.chunk) for f in (materialised, chunked))
    diffs = [rel(v_c, v_m)] + [rel(c, m) for c, m in zip(g_c, g_m, strict=True)]
    (pm, gm), (pc, gc) = (peak(f, hidden, weight, targets, args.chunk) for f in (materialised, chunked))
    times = {materialised: [], chunked: []}
    for _ in range(args.repeats):
        for f in times:
            times[f].append(seconds(f, hidden, weight, targets, args.chunk))
    tm, tc = (statistics.median(times[f]) for f in (materialised, chunked))
    print(f"{name}: loss-phase peak materialised {pm / 1e6:,.1f} MB, chunked {pc / 1e6:,.1f} MB "
          f"(ratio {pc / pm:.4f}); without the gradients both return ({gm / 1e6:,.1f} MB): "
          f"{(pm - gm) / 1e6:,.1f} vs {(pc - gc) / 1e6:,.1f} MB (ratio {(pc - gc) / (pm - gm):.4f})", flush=True)
    print(f"{name}: step time materialised {tm:.3f} s, chunked {tc:.3f} s (ratio {tc / tm:.3f}); "
          f"rel diff value {diffs[0]:.2e}, grads {', '.join(f'{d:.2e}' for d in diffs[1:])}", flush=True)
    return pc / pm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=156_940)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--frozen-only", action="store_true", help="skip the trained-head case (the ratio's is frozen)")
    args = ap.parse_args()
    torch.manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, device=args.device).requires_grad_()
    weight = torch.randn(args.vocab, args.hidden, device=args.device) * args.hidden ** -0.5
    targets = torch.randint(0, args.vocab, (args.tokens,), device=args.device)
    targets[: args.tokens // 10] = -100  # a prompt without loss
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"{args.tokens} tokens, vocab {args.vocab:,}, hidden {args.hidden}, chunk {args.chunk}, fp32, {where}",
          flush=True)
    frozen = case("frozen head", hidden, weight, targets, args)
    if not args.frozen_only:
        case("trained head", hidden, weight.clone().requires_grad_(), targets, args)
    print(f"ratio {frozen:.4f}")


if __name__ == "__main__":
    main()
