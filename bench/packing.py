"""Packed batches (``train.packing``) vs padded ones, side by side in one process, on two datasets: the demo's
(codec_lm as the demo trains it) and an Orpheus-layout one of varied lengths (1-12 s clips, the Orpheus family's
own examples: prompt + 7 SNAC ids per frame, random init at a small width).

Three arms train the same init on the first ``--steps`` batches of epoch 0 (AdamW, fp32, dropout 0):
- ``bucketed``: today's unpacked plan, length-sorted buckets padded to their longest row (``train.packing=false``);
- ``shuffled``: the packed plan's batches (shuffled rows cut at the token budget), padded;
- ``packed``: the same batches packed in one row each (``train.packing=true``).
``shuffled`` and ``packed`` see the same examples step for step: their losses must agree within float summation
order (the largest relative difference per step is printed). Audio-seconds per second count the steps after
the first 3; arms alternate per repeat so machine noise hits all alike.

    .venv/bin/python bench/packing.py [--steps 20] [--repeats 1] [--root PREPARED_DEMO_ROOT]
    .venv/bin/python bench/packing.py --only orpheus --width 3072 --layers 4 --heads 24 --kv-heads 8 \
        --intermediate 8192 --budget 8192 --bf16 --lora --compile      # Orpheus-3B width on a GPU (gpu_suite.sh)

On CUDA each arm also reports tokens/s, MFU (model FLOPs: 6 x parameters x tokens, 4 x with LoRA's frozen
base, over the card's dense bf16 peak) and ``max_memory_allocated``; ``--compile`` adds a packed arm with
``train.compile``'s regional compilation (its first steps, the compile, are among the warm-up ones left out);
``--trainer`` adds a Hugging Face ``Trainer`` on the same module and LoRA (SDPA, gradient checkpointing, its
own loss, a fixed batch size within the budget, grouped by length).

Last line: ``ratio <packed / shuffled audio-s/s>``, the smaller over the datasets run (goal >= 1.3); with
``--arms packed --compile`` (no padded arm), ``<packed+compile / packed>``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from voxrelay.cli import demo_config_path  # noqa: E402
from voxrelay.config import load_config  # noqa: E402
from voxrelay.data.loader import BatchPlan, PreparedDataset  # noqa: E402
from voxrelay.data.prepare import load_index, load_prepared_codec, prepare  # noqa: E402
from voxrelay.models.base import DataSpec, pop_counts  # noqa: E402
from voxrelay.models.linear_ce import CHUNKED  # noqa: E402
from voxrelay.models.packing import padded_fraction  # noqa: E402
from voxrelay.models.registry import build_model  # noqa: E402

DEMO_DATA = ["data.sources=[{type: demo, minutes: 20, seed: 0, voices: [en-us]}]", "model.dropout=0"]
WARM = 3
ARMS = ("bucketed", "shuffled", "packed")
BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10G": 70e12, "T4": 65e12}


def demo_set(root: str) -> SimpleNamespace:
    cfg = load_config(str(demo_config_path()), [f"root={root}", *DEMO_DATA])
    index = load_index(cfg.prepared_uri)
    model = build_model(cfg.model, DataSpec.from_prepared(index, load_prepared_codec(cfg.prepared_uri, index)), 0)
    rows = [r for r in PreparedDataset.open(cfg.prepared_uri, "train", index).rows if model.length(r) <= 4096]
    return SimpleNamespace(name="demo (codec_lm)", model=model, rows=rows, budget=cfg.train.batch_tokens, lr=2e-3)


def orpheus_set(tmp: str, args: argparse.Namespace) -> SimpleNamespace:
    from tests.helpers.orpheus import save_llama3_tokenizer
    from voxrelay.models.orpheus.config import OrpheusConfig

    tok = save_llama3_tokenizer(Path(tmp) / "llama3-tok")
    cfg = OrpheusConfig(tokenizer=str(tok), hidden_size=args.width, num_layers=args.layers, num_heads=args.heads,
                        num_kv_heads=args.kv_heads, intermediate_size=args.intermediate, max_seq_len=4096,
                        weights_dtype="float32")
    model = build_model(cfg, DataSpec(7, 4096, ["tara", "leo"], 12.0, 24000), 0)
    rng = np.random.default_rng(0)
    words = "the quick brown fox jumps over a lazy dog while tara and leo laugh about it".split()
    data = []
    for i in range(args.rows):
        seconds = float(rng.uniform(1.0, 12.0))
        text = " ".join(rng.choice(words, int(seconds * 2.5) + 1))
        data.append(SimpleNamespace(id=f"o{i}", text=text, speaker=["tara", "leo"][i % 2], description=None,
                                    duration=seconds, codes=rng.integers(0, 4096, (7, int(seconds * 12)))))
    return SimpleNamespace(name=f"orpheus layout (width {args.width} x {args.layers} layers)", model=model, rows=data,
                           budget=args.budget, lr=1e-3)


def batches(ds: SimpleNamespace, arm: str, steps: int) -> list[list[int]]:
    plan = BatchPlan(ds.lengths, [r.duration for r in ds.rows], seed=0, batch_tokens=ds.budget,
                     packed=arm != "bucketed")
    return list(plan.batches(0))[:steps]


def with_examples(ds: SimpleNamespace, steps: int) -> SimpleNamespace:
    """Each row's example made once, before any timing (the loop builds them on a thread, ahead of the step)."""
    ds.lengths = [len(ds.model.example(r)["input_ids"]) for r in ds.rows]
    used = {i for arm in ARMS for b in batches(ds, arm, steps) for i in b}
    ds.examples = {i: ds.model.example(ds.rows[i]) for i in used}
    return ds


def run_arm(ds: SimpleNamespace, arm: str, steps: int, init: dict, device: str, bf16: bool) -> dict:
    model = ds.model
    model.module.load_state_dict(init)
    model.module.train()
    trained = [q for q in model.module.parameters() if q.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=ds.lr, weight_decay=0.0)
    collate = model.collate_packed if arm.startswith("packed") else model.collate
    losses, audio, tokens, pads, t0 = [], 0.0, 0, [], 0.0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for i, ids in enumerate(batches(ds, "packed" if arm == "packed+compile" else arm, steps)):
        if i == WARM:
            _sync(device)
            t0, audio, tokens = time.perf_counter(), 0.0, 0
        batch = collate([ds.examples[j] for j in ids])
        counts = pop_counts(batch)
        pads.append(padded_fraction(batch))
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            terms = model.loss(model.module, batch)
        loss = terms["ce"].sum / counts["ce"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        audio += sum(ds.rows[j].duration for j in ids)
        tokens += sum(len(ds.examples[j]["input_ids"]) for j in ids)
    _sync(device)
    seconds = time.perf_counter() - t0
    memory = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return {"audio_s_per_s": audio / seconds, "tokens_per_s": tokens / seconds, "pad": float(np.mean(pads)),
            "losses": losses, "gib": memory}


def trainer_arm(ds: SimpleNamespace, args: argparse.Namespace, init: dict, native: bool = False) -> dict:
    """A Hugging Face ``Trainer`` on the same module (the same LoRA): SDPA, gradient checkpointing, transformers'
    own loss (materialised logits), the largest fixed batch size whose batches stay within the token budget, rows
    grouped by length (``train_sampling_strategy="group_by_length"``), the same steps and learning rate.
    ``native``: the module brings its own attention and checkpointing (Unsloth's, ``bench/unsloth_arm.py``)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    model = ds.model
    model.module.load_state_dict(init)
    used = sorted(ds.examples)
    examples = [{"input_ids": ds.examples[j]["input_ids"], "labels": ds.examples[j]["labels"], "row": j}
                for j in used]
    batch_size = max(1, ds.budget // max(len(e["input_ids"]) for e in examples))
    seen = {"audio": 0.0, "tokens": 0}

    def collate(items: list[dict]) -> dict:
        seen["audio"] += sum(ds.rows[e["row"]].duration for e in items)
        seen["tokens"] += sum(len(e["input_ids"]) for e in items)
        batch = model.collate([{k: v for k, v in e.items() if k != "row"} for e in items])
        pop_counts(batch)
        return {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}

    marks: list[tuple[float, float, int]] = []

    class Marks(TrainerCallback):
        def on_step_end(self, *_a, **_k):
            _sync(args.device)
            marks.append((time.perf_counter(), seen["audio"], seen["tokens"]))

    base = model.module.get_base_model() if hasattr(model.module, "get_base_model") else model.module
    attention = base.config._attn_implementation
    if not native:
        base.set_attn_implementation("sdpa")  # the Trainer as users run it: transformers' SDPA
    with tempfile.TemporaryDirectory() as out:
        hf_args = TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=batch_size, learning_rate=ds.lr,
            train_sampling_strategy="group_by_length", gradient_checkpointing=not native,
            gradient_checkpointing_kwargs={"use_reentrant": False}, bf16=args.bf16, save_strategy="no",
            report_to=[], logging_steps=10**6, dataloader_num_workers=0, seed=0, use_cpu=args.device == "cpu",
            remove_unused_columns=False, disable_tqdm=True, lr_scheduler_type="constant", weight_decay=0.0)
        Trainer(model=model.module, args=hf_args, train_dataset=examples, data_collator=collate,
                callbacks=[Marks()]).train()
    if not native:
        base.gradient_checkpointing_disable()  # the arms after this one train as before: no checkpointing,
        base.set_attn_implementation(attention)  # the packed attention,
        vars(model.module).pop("forward", None)  # and no autocast wrapper accelerate left on the instance
    (t0, a0, n0), (t1, a1, n1) = marks[WARM - 1], marks[-1]
    memory = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else float("nan")
    return {"audio_s_per_s": (a1 - a0) / (t1 - t0), "tokens_per_s": (n1 - n0) / (t1 - t0), "pad": float("nan"),
            "losses": [], "gib": memory}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def mfu(ds: SimpleNamespace, tokens_per_s: float, lora: bool) -> float:
    """Model FLOPs utilisation on this card's dense bf16 peak (nan off CUDA or on an unknown card)."""
    if not torch.cuda.is_available():
        return float("nan")
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in BF16_PEAK.items() if k in name), None)
    params = sum(q.numel() for q in ds.model.module.parameters())
    return (4 if lora else 6) * params * tokens_per_s / peak if peak else float("nan")


def measure(ds: SimpleNamespace, args: argparse.Namespace) -> dict:
    from voxrelay.train.strategies import apply_lora, compile_layers

    torch.manual_seed(0)
    model = ds.model
    if model.chunked_heads:  # what `voxrelay train` picks (train.chunked_loss): no [tokens, vocab] logits
        model.loss_kernel = CHUNKED
    if args.lora:
        from voxrelay.models.lora_config import LoraConfig

        apply_lora(model, LoraConfig(), torch.bfloat16 if args.bf16 else None)
    model.module.to(args.device)
    attention = model.enable_packing(args.device, args.bf16)  # padded batches: transformers' SDPA through it
    print(f"  {ds.name}: attention of packed rows {attention}", flush=True)
    init = copy.deepcopy(model.module.state_dict())
    arms = [*(args.arms.split(",") if args.arms else ARMS), *(["hf_trainer"] if args.trainer else []),
            *(["packed+compile"] if args.compile else [])]
    results: dict[str, list] = {a: [] for a in arms}
    for r in range(args.repeats):
        for arm in arms if r % 2 == 0 else reversed(arms):
            if arm == "packed+compile" and r == 0:
                compile_layers(model, True)  # the arms after it in this repeat order are compiled too: it runs last
            if arm == "hf_trainer":
                if args.device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                results[arm].append(trainer_arm(ds, args, init))
            else:
                results[arm].append(run_arm(ds, arm, args.steps, init, args.device, args.bf16))
            print(f"  {ds.name}, repeat {r}, {arm}: {results[arm][-1]['audio_s_per_s']:.1f} audio-s/s", flush=True)
        if args.compile:
            break  # compiled layers stay compiled: one repeat keeps the plain arms plain
    out = {a: {"audio_s_per_s": statistics.median(x["audio_s_per_s"] for x in runs), "pad": runs[0]["pad"],
               "tokens_per_s": statistics.median(x["tokens_per_s"] for x in runs), "gib": runs[0]["gib"],
               "losses": runs[0]["losses"]} for a, runs in results.items()}
    if "shuffled" in out and "packed" in out:
        a, b = np.asarray(out["shuffled"]["losses"]), np.asarray(out["packed"]["losses"])
        out["loss_rel_diff"] = float(np.max(np.abs(a - b) / np.abs(a)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--root", help="a root where the demo data of this bench is prepared already")
    ap.add_argument("--only", choices=["demo", "orpheus"], help="one dataset only")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--bf16", action="store_true", help="autocast to bf16 (as train.precision=bf16)")
    ap.add_argument("--lora", action="store_true", help="the family's LoRA defaults (train.lora: {})")
    ap.add_argument("--compile", action="store_true", help="add a packed arm with compiled layers (one repeat)")
    ap.add_argument("--trainer", action="store_true", help="add a HF Trainer arm (SDPA, gradient checkpointing)")
    ap.add_argument("--arms", help=f"comma-separated subset of {','.join(ARMS)} (default all; packed is needed)")
    ap.add_argument("--width", type=int, default=256, help="Orpheus layout: hidden size (Orpheus-3B: 3072)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--budget", type=int, default=4000, help="Orpheus layout: train.batch_tokens")
    ap.add_argument("--rows", type=int, default=600, help="Orpheus layout: clips of 1-12 s")
    args = ap.parse_args()
    ratios, compiled = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or f"{tmp}/root"
        if args.only != "orpheus" and not args.root:
            prepare(load_config(str(demo_config_path()), [f"root={root}", *DEMO_DATA]))
        sets = [] if args.only == "orpheus" else [lambda: demo_set(root)]
        sets += [] if args.only == "demo" else [lambda: orpheus_set(tmp, args)]
        for make in sets:
            ds = make()
            out = measure(with_examples(ds, args.steps), args)
            print(f"\n{ds.name}: {len(ds.rows)} rows, budget {ds.budget} tokens, {args.steps} steps, {args.device}"
                  f"{', bf16' if args.bf16 else ''}{', LoRA' if args.lora else ''}")
            print(f"{'arm':<15} {'padded':>8} {'audio-s/s':>10} {'tokens/s':>10} {'MFU':>6} {'max GiB':>8}")
            for arm in (a for a in out if isinstance(out[a], dict)):
                o = out[arm]
                print(f"{arm:<15} {o['pad']:>8.1%} {o['audio_s_per_s']:>10.1f} {o['tokens_per_s']:>10.0f} "
                      f"{mfu(ds, o['tokens_per_s'], args.lora):>6.1%} {o['gib']:>8.2f}")
            packed = out["packed"]["audio_s_per_s"]
            if "loss_rel_diff" in out:
                print(f"packed / shuffled {packed / out['shuffled']['audio_s_per_s']:.3f}, packed / bucketed "
                      f"{packed / out['bucketed']['audio_s_per_s']:.3f}; loss, shuffled vs packed: largest relative "
                      f"difference per step {out['loss_rel_diff']:.2e}", flush=True)
                ratios.append(packed / out["shuffled"]["audio_s_per_s"])
            if "packed+compile" in out:
                compiled.append(out["packed+compile"]["audio_s_per_s"] / packed)
                print(f"packed+compile / packed {compiled[-1]:.3f}", flush=True)
            if "hf_trainer" in out:
                print(f"packed / HF Trainer audio-s/s {packed / out['hf_trainer']['audio_s_per_s']:.3f} (goal >= 1.5)")
    # the packed / padded ratio; with --arms packed --compile alone, packed+compile / packed
    print(f"ratio {min(ratios or compiled):.3f}" if ratios or compiled else "ratio nan (no arm pair to compare)")


if __name__ == "__main__":
    main()
