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

Last line: ``ratio <packed / shuffled audio-s/s>``, the smaller of the two datasets (goal >= 1.3).
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


def demo_set(root: str) -> SimpleNamespace:
    cfg = load_config(str(demo_config_path()), [f"root={root}", *DEMO_DATA])
    index = load_index(cfg.prepared_uri)
    model = build_model(cfg.model, DataSpec.from_prepared(index, load_prepared_codec(cfg.prepared_uri, index)), 0)
    rows = [r for r in PreparedDataset.open(cfg.prepared_uri, "train", index).rows if model.length(r) <= 4096]
    return SimpleNamespace(name="demo (codec_lm)", model=model, rows=rows, budget=cfg.train.batch_tokens, lr=2e-3)


def orpheus_set(tmp: str, rows: int = 600) -> SimpleNamespace:
    from tests.helpers.orpheus import save_llama3_tokenizer
    from voxrelay.models.orpheus.config import OrpheusConfig

    tok = save_llama3_tokenizer(Path(tmp) / "llama3-tok")
    cfg = OrpheusConfig(tokenizer=str(tok), hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                        intermediate_size=768, max_seq_len=4096, weights_dtype="float32")
    model = build_model(cfg, DataSpec(7, 4096, ["tara", "leo"], 12.0, 24000), 0)
    rng = np.random.default_rng(0)
    words = "the quick brown fox jumps over a lazy dog while tara and leo laugh about it".split()
    data = []
    for i in range(rows):
        seconds = float(rng.uniform(1.0, 12.0))
        text = " ".join(rng.choice(words, int(seconds * 2.5) + 1))
        data.append(SimpleNamespace(id=f"o{i}", text=text, speaker=["tara", "leo"][i % 2], description=None,
                                    duration=seconds, codes=rng.integers(0, 4096, (7, int(seconds * 12)))))
    return SimpleNamespace(name="orpheus layout", model=model, rows=data, budget=4000, lr=1e-3)


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


def run_arm(ds: SimpleNamespace, arm: str, steps: int, init: dict) -> dict:
    model = ds.model
    model.module.load_state_dict(init)
    model.module.train()
    optimizer = torch.optim.AdamW(model.module.parameters(), lr=ds.lr, weight_decay=0.0)
    collate = model.collate_packed if arm == "packed" else model.collate
    losses, audio, pads, t0 = [], 0.0, [], 0.0
    for i, ids in enumerate(batches(ds, arm, steps)):
        if i == WARM:
            t0, audio = time.perf_counter(), 0.0
        batch = collate([ds.examples[j] for j in ids])
        counts = pop_counts(batch)
        pads.append(padded_fraction(batch))
        terms = model.loss(model.module, batch)
        loss = terms["ce"].sum / counts["ce"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        audio += sum(ds.rows[j].duration for j in ids)
    return {"audio_s_per_s": audio / (time.perf_counter() - t0), "pad": float(np.mean(pads)), "losses": losses}


def measure(ds: SimpleNamespace, steps: int, repeats: int) -> dict:
    torch.manual_seed(0)
    if ds.model.chunked_heads:  # what `voxrelay train` picks (train.chunked_loss): no [tokens, vocab] logits
        ds.model.loss_kernel = CHUNKED
    init = copy.deepcopy(ds.model.module.state_dict())
    ds.model.enable_packing("cpu")  # padded batches still take transformers' SDPA path through it
    results: dict[str, list] = {a: [] for a in ARMS}
    for r in range(repeats):
        for arm in ARMS if r % 2 == 0 else reversed(ARMS):
            results[arm].append(run_arm(ds, arm, steps, init))
            print(f"  {ds.name}, repeat {r}, {arm}: {results[arm][-1]['audio_s_per_s']:.1f} audio-s/s", flush=True)
    out = {a: {"audio_s_per_s": statistics.median(x["audio_s_per_s"] for x in runs), "pad": runs[0]["pad"],
               "losses": runs[0]["losses"]} for a, runs in results.items()}
    a, b = np.asarray(out["shuffled"]["losses"]), np.asarray(out["packed"]["losses"])
    out["loss_rel_diff"] = float(np.max(np.abs(a - b) / np.abs(a)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--root", help="a root where the demo data of this bench is prepared already")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or f"{tmp}/root"
        if not args.root:
            prepare(load_config(str(demo_config_path()), [f"root={root}", *DEMO_DATA]))
        for ds in (demo_set(root), orpheus_set(tmp)):
            out = measure(with_examples(ds, args.steps), args.steps, args.repeats)
            print(f"\n{ds.name}: {len(ds.rows)} rows, budget {ds.budget} tokens, {args.steps} steps")
            print(f"{'arm':<10} {'padded':>8} {'audio-s/s':>10}")
            for arm in ARMS:
                print(f"{arm:<10} {out[arm]['pad']:>8.1%} {out[arm]['audio_s_per_s']:>10.1f}")
            packed = out["packed"]["audio_s_per_s"]
            print(f"packed / shuffled {packed / out['shuffled']['audio_s_per_s']:.3f}, packed / bucketed "
                  f"{packed / out['bucketed']['audio_s_per_s']:.3f}; loss, shuffled vs packed: largest relative "
                  f"difference per step {out['loss_rel_diff']:.2e}", flush=True)
            ratios.append(packed / out["shuffled"]["audio_s_per_s"])
    print(f"ratio {min(ratios):.3f}")


if __name__ == "__main__":
    main()
