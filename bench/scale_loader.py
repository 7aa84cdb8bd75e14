"""The streaming reader at corpus scale, by simulation: a synthetic prepared dataset with the row lengths of
LibriTTS-R + MLS (seed 000's 10k hours), on the S3 test server (moto on 127.0.0.1) and in a local folder.

    .venv/bin/python bench/scale_loader.py [--hours 1000] [--small-hours 250] [--rate-hours 10]

Two corpora of ``--small-hours`` and ``--hours`` (codes shortened ``--frames-div`` times to spare disk; the row
index keeps the true frame counts, so plans and batches are those of the real corpus) give, each in a fresh
process: time to first batch, peak RSS, local cache bytes. Their difference gives RSS per row; both are
extrapolated to 10k hours (formulas printed). A third corpus of ``--rate-hours`` with full-length DAC codes
(86 Hz x 9 codebooks) gives the reader's own rate (fetch, decode, Parler-like examples, collate, on the
builder thread), compared with what a Parler-mini step on an A100 consumes.

Last line: ``ratio <reader audio-s/s / needed audio-s/s>`` (goal >= 10).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from voxrelay import storage  # noqa: E402
from voxrelay.data import rowindex as ri  # noqa: E402
from voxrelay.data import shards as sh  # noqa: E402

K, FRAME_RATE, SHARD_ROWS = 9, 86.13, 256
BATCH_TOKENS = 24_000  # a Parler-mini micro-batch: ~16 clips of 15 s (decoder positions)
# what a Parler-mini step on an A100 consumes: 6 x decoder params FLOPs per decoder position, at 40% of
# 312 TFLOP/s bf16 (the frozen T5 over a ~30-token description and DAC are left out: they only lower it)
A100_FLOPS, MFU, DECODER_PARAMS = 312e12, 0.40, 423e6
WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()


def durations(hours: float, rng: np.random.Generator) -> np.ndarray:
    """Clip lengths like LibriTTS-R (6% of the hours: log-normal around 5.6 s, 0.5-35 s) + MLS English (10-20 s)."""
    out, total = [], 0.0
    while total < hours * 3600:
        n = 4096
        libri = np.clip(rng.lognormal(np.log(4.5), 0.7, n), 0.5, 35.0)
        mls = np.clip(rng.normal(15.0, 2.8, n), 10.0, 20.0)
        pick = np.where(rng.random(n) < 0.15, libri, mls)  # 15% of rows ~ 6% of hours
        out.append(pick)
        total += float(pick.sum())
    d = np.concatenate(out)
    return d[: int(np.searchsorted(np.cumsum(d), hours * 3600)) + 1].astype(np.float32)


def write_dataset(uri: str, hours: float, frames_div: int, seed: int = 0) -> dict:
    """A committed prepared split (train) of ``hours`` of rows; returns its index."""
    rng = np.random.default_rng(seed)
    dur = durations(hours, rng)
    frames = np.maximum(1, np.round(dur * FRAME_RATE)).astype(np.int32)
    index: dict = {"num_codebooks": K, "shards": [], "identity": {"bench": seed, "hours": hours}}
    metas = []
    for s, start in enumerate(range(0, len(dur), SHARD_ROWS)):
        utts = []
        for i in range(start, min(start + SHARD_ROWS, len(dur))):
            words = rng.choice(WORDS, max(1, int(dur[i] * 2.7)))
            codes = rng.integers(0, 1024, (K, max(1, int(frames[i]) // frames_div)), dtype=np.int16)
            utts.append(sh.EncodedUtterance(f"r{i}", " ".join(words), f"spk{i % 2000}", None, float(dur[i]), codes))
        name = f"train-{s:05d}"
        storage.write_bytes(sh.shard_uri(uri, name), sh.encode_table(utts))
        meta = ri.row_meta(utts)
        meta["num_frames"] = frames[start:start + len(utts)].tolist()  # the true frame counts
        metas.append(meta)
        index["shards"].append({"name": name, "split": "train", "rows": len(utts)})
    index["row_index"] = {"train": ri.write_row_index(uri, "train", metas)}
    index["hours"] = float(dur.sum()) / 3600
    storage.write_json(storage.join(uri, sh.INDEX_FILE), index)
    return index


def parler_example(row) -> dict:
    """What Parler's example costs: transcript ids and the codes as int64 labels [K, T]."""
    return {"prompt": np.frombuffer(row.text.encode(), dtype=np.uint8).astype(np.int64),
            "labels": row.codes.astype(np.int64)}


def parler_collate(examples: list[dict]):
    import torch

    width = max(e["labels"].shape[1] for e in examples)
    labels = torch.full((len(examples), K, width), -100, dtype=torch.int64)
    plen = max(len(e["prompt"]) for e in examples)
    prompt = torch.zeros((len(examples), plen), dtype=torch.int64)
    for i, e in enumerate(examples):
        labels[i, :, : e["labels"].shape[1]] = torch.from_numpy(e["labels"])
        prompt[i, plen - len(e["prompt"]):] = torch.from_numpy(e["prompt"])
    return {"labels": labels, "prompt_ids": prompt}


def open_stream(uri: str, cache_gb: float, ram_gb: float, window: int = 64, ahead: int = 2, seed: int = 0):
    """The stream ``voxrelay train`` builds for a codes family (no model: Parler-like examples)."""
    from voxrelay.data.loader import BatchPlan, BatchStream
    from voxrelay.data.shard_cache import ShardCache
    from voxrelay.data.stream import ShardSource, StreamBatches
    from voxrelay.paths import cache_dir

    index = sh.load_index(uri)
    rows = ri.RowIndex.load(uri, index, "train")
    lengths = rows.num_frames.astype(np.int64) + rows.text_chars // 4 + K  # Parler: prompt + frames + delay tail
    keep = np.arange(len(rows))
    plan = BatchPlan(lengths, rows.duration, seed, batch_tokens=BATCH_TOKENS, shards=rows.shard, window=window)
    source = ShardSource(uri, K, rows, ShardCache(cache_dir("prepared"), int(cache_gb * 2**30)), int(ram_gb * 2**30))
    return BatchStream(plan, StreamBatches(source, keep, parler_example, parler_collate, 8), ahead=ahead), rows


def measure(uri: str, batches: int, cache_gb: float, ram_gb: float, out: mp.Queue) -> None:
    """In a fresh process (imports done first): the row index, the example lengths from the shards' text
    columns (a first session; cached after), time to first batch (index, plan, first shards), then ``batches``
    more batches; peak RSS."""
    import voxrelay.data.stream  # noqa: F401 - imported before the clock starts (torch: ~2 s)

    t0 = time.perf_counter()
    rows = ri.RowIndex.load(uri, sh.load_index(uri), "train")
    t_index = time.perf_counter() - t0
    ri.plan_lengths(lambda m: len(m.text) // 4 + m.num_frames + K, "bench", uri, rows)
    t_lengths = time.perf_counter() - t0 - t_index
    t0 = time.perf_counter()
    stream, rows = open_stream(uri, cache_gb, ram_gb)
    it = iter(stream)
    next(it)
    t_first = time.perf_counter() - t0
    t1, seconds = time.perf_counter(), 0.0
    for _ in range(batches):
        seconds += next(it)["audio_seconds"]
    rate_s = time.perf_counter() - t1
    stream.close()
    from voxrelay.paths import cache_dir

    cached = sum(p.stat().st_size for p in cache_dir("prepared").rglob("*.parquet"))
    out.put({"rows": len(rows), "index_s": t_index, "lengths_s": t_lengths, "first_s": t_first,
             "batches_per_s": batches / rate_s, "audio_s_per_s": seconds / rate_s,
             "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cache_mb": cached / 2**20,
             "index_mb": rows.nbytes / 2**20})


def run_measure(uri: str, batches: int, cache_dir: str, cache_gb: float = 0.5, ram_gb: float = 0.5) -> dict:
    os.environ["VOXRELAY_CACHE"] = cache_dir
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=measure, args=(uri, batches, cache_gb, ram_gb, out))
    proc.start()
    result = out.get(timeout=1800)
    proc.join()
    return result


def needed_audio_s_per_s() -> float:
    positions_per_s = A100_FLOPS * MFU / (6 * DECODER_PARAMS)
    return positions_per_s / FRAME_RATE


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=1000)
    ap.add_argument("--small-hours", type=float, default=250)
    ap.add_argument("--rate-hours", type=float, default=10)
    ap.add_argument("--frames-div", type=int, default=64)
    ap.add_argument("--batches", type=int, default=200)
    args = ap.parse_args()
    from tests.helpers.servers import S3Server, apply_env

    with S3Server() as s3, tempfile.TemporaryDirectory() as tmp:
        apply_env(s3.env())
        results = {}
        for where, base in (("s3", f"s3://{s3.bucket}/bench"), ("local", f"{tmp}/local")):
            sets = (("small", args.small_hours, args.frames_div), ("big", args.hours, args.frames_div),
                    ("rate", args.rate_hours, 1))
            for label, hours, div in sets:
                uri = storage.join(base, f"{label}-{hours:g}h")
                t = time.perf_counter()
                index = write_dataset(uri, hours, div)
                print(f"{where} {label}: wrote {index['hours']:.0f} h, {sum(s['rows'] for s in index['shards'])} rows "
                      f"in {len(index['shards'])} shards ({time.perf_counter() - t:.0f} s)", flush=True)
                results[where, label] = run_measure(uri, args.batches if label == "rate" else 20,
                                                    f"{tmp}/cache-{where}-{label}")
                print(f"  {results[where, label]}", flush=True)
        report(results, args)


def report(results: dict, args) -> None:
    need = needed_audio_s_per_s()
    print(f"\nneeded by a Parler-mini step on an A100: {need:.0f} audio-s/s = {A100_FLOPS:.0e} x {MFU} MFU / "
          f"(6 x {DECODER_PARAMS / 1e6:.0f}M decoder params) / {FRAME_RATE} frames/s")
    worst = None
    for where in ("s3", "local"):
        small, big, rate = results[where, "small"], results[where, "big"], results[where, "rate"]
        per_row = (big["rss_mb"] - small["rss_mb"]) / (big["rows"] - small["rows"]) * 2**20
        rows_10k = big["rows"] * 10_000 / args.hours
        start_per_row = (big["first_s"] - small["first_s"]) / (big["rows"] - small["rows"])  # what grows with rows
        print(f"{where}: first batch {small['first_s']:.1f} s at {args.small_hours:g} h, {big['first_s']:.1f} s at "
              f"{args.hours:g} h; peak RSS {small['rss_mb']:.0f} / {big['rss_mb']:.0f} MB ({per_row:.0f} B per row; "
              f"row index {big['index_mb']:.1f} MB); local cache {big['cache_mb']:.0f} MB (cap 512 MB); lengths from "
              f"the text columns (first session only) {big['lengths_s']:.1f} s")
        more = rows_10k - big["rows"]
        print(f"  10k hours ({rows_10k / 1e6:.2f} M rows): first batch ~ {big['first_s']:.1f} s + "
              f"{start_per_row * 1e6:.2f} us x {more:.0f} more rows = {big['first_s'] + start_per_row * more:.1f} s; "
              f"RSS ~ {big['rss_mb']:.0f} MB + {per_row:.0f} B x {more:.0f} = "
              f"{big['rss_mb'] + per_row * more / 2**20:.0f} MB; a first session's "
              f"lengths ~ {big['lengths_s'] / big['rows'] * rows_10k:.0f} s on one process (shared by shard: / N)")
        print(f"  reader alone (full-length codes): {rate['batches_per_s']:.1f} batches/s, "
              f"{rate['audio_s_per_s']:.0f} audio-s/s = {rate['audio_s_per_s'] / need:.1f}x the need")
        worst = min(worst or 1e9, rate["audio_s_per_s"] / need)
    print(f"ratio {worst:.2f}")


if __name__ == "__main__":
    main()
