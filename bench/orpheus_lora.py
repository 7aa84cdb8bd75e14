"""Orpheus tiny: step time and checkpoint size, full fine-tune vs LoRA (family defaults: r 32, alpha 64,
rsLoRA, every projection, with train.lora.embeddings=full: lm_head + embed_tokens trained in full and tied), and
LoRA with the adapters alone (today's default on an Orpheus vocabulary), side by side in one process.

The model is the CI test's (tests/helpers/orpheus.py: a 1-layer Llama of width 32 with Orpheus' 156,940-id
vocabulary and tied embeddings); batches are random SNAC frames of the given length. Repeats alternate
between the two so machine noise hits both alike. A checkpoint is what the run saves: the trained tensors
(safetensors) + the optimizer state. Last line: ratio = LoRA ms/step / full ms/step.

    .venv/bin/python bench/orpheus_lora.py [--steps 8] [--repeats 3] [--frames 60] [--batch 4] [--hidden 32]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from safetensors.torch import save

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests.helpers: the tiny parts, built offline

from tests.helpers.orpheus import save_llama3_tokenizer  # noqa: E402
from voxrelay.config import TrainConfig  # noqa: E402
from voxrelay.models.base import DataSpec  # noqa: E402
from voxrelay.models.lora_config import LoraConfig  # noqa: E402
from voxrelay.models.orpheus.config import OrpheusConfig  # noqa: E402
from voxrelay.models.registry import build_model  # noqa: E402
from voxrelay.train.optim import build_optimizer  # noqa: E402
from voxrelay.train.strategies import apply_lora, trainable_state  # noqa: E402

DATA = DataSpec(7, 4096, [], 11.71875, 24000)


# "lora": the embeddings in full, as the family default was before issue 34 (today: new token rows only, none here)
VARIANTS = {"full": None, "lora": LoraConfig(embeddings="full"), "lora, adapters only": LoraConfig()}


def build(tokenizer: Path, hidden: int, lora: LoraConfig | None):
    heads = max(2, hidden // 32)
    cfg = OrpheusConfig(tokenizer=str(tokenizer), hidden_size=hidden, num_layers=1 if hidden <= 64 else 4,
                        num_heads=heads, num_kv_heads=1, intermediate_size=2 * hidden, max_seq_len=4096)
    model = build_model(cfg, DATA, 0)
    torch.manual_seed(0)
    apply_lora(model, lora)
    model.module.train()
    return model, build_optimizer(TrainConfig(lr=1e-4), model.param_groups(0.01))


def batches(model, n: int, batch: int, frames: int) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = [[SimpleNamespace(text="a sentence of about this many characters", speaker=None, description=None,
                             codes=rng.integers(0, 4096, (7, frames))) for _ in range(batch)] for _ in range(n)]
    return [model.collate([model.example(r) for r in b]) for b in rows]


def step(model, optimizer, batch: dict) -> None:
    ce = model.loss(model.module, batch)["ce"]
    (ce.sum / ce.count).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def checkpoint_bytes(model, optimizer) -> tuple[int, int]:
    buf = io.BytesIO()
    torch.save(optimizer.state_dict(), buf)
    return len(save({k: v.contiguous() for k, v in trainable_state(model.module).items()})), len(buf.getvalue())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--frames", type=int, default=60)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--hidden", type=int, default=32)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = save_llama3_tokenizer(Path(tmp) / "tok")
        runs = {name: build(tokenizer, args.hidden, lora) for name, lora in VARIANTS.items()}
    data = batches(runs["full"][0], args.steps, args.batch, args.frames)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for model, opt in runs.values():
        step(model, opt, data[0])  # warm-up: allocations, optimizer state
    for _ in range(args.repeats):
        for name, (model, opt) in runs.items():
            t0 = time.perf_counter()
            for b in data:
                step(model, opt, b)
            times[name].append((time.perf_counter() - t0) / len(data) * 1000)
    tokens = int(data[0]["attention_mask"].sum())
    print(f"tiny Orpheus (hidden {args.hidden}), batch {args.batch} x {args.frames} SNAC frames = {tokens} tokens, "
          f"{torch.get_num_threads()} threads")
    for name, (model, opt) in runs.items():
        total = sum(p.numel() for p in model.module.parameters())
        trained = sum(p.numel() for p in model.module.parameters() if p.requires_grad)
        weights, state = checkpoint_bytes(model, opt)
        each = ", ".join(f"{t:.0f}" for t in times[name])
        print(f"{name:20s} {statistics.median(times[name]):8.1f} ms/step (runs {each})"
              f" | trained {trained:,} of {total:,} params | checkpoint {weights / 2**20:.2f} MiB weights + "
              f"{state / 2**20:.2f} MiB optimizer")
    print(f"ratio {statistics.median(times['lora']) / statistics.median(times['full']):.3f}")


if __name__ == "__main__":
    main()
