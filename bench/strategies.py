"""Tokens/s and memory of each training strategy, side by side in one run: the same tiny codec_lm model, the
same seed and the same global batches for every strategy, built and stepped by voxrelay's own code
(apply_lora, enable_gradient_checkpointing, wrap_model -> fsdp_mesh/apply_fsdp or accelerate's DDP,
build_optimizer over optimizer_groups, train_step).

Each strategy runs in its own launch (torchrun with 2 processes, plain python with 1) of this script's worker
mode; a 2-process run gives each process its half of every global batch, so every strategy trains on the same
examples. On CPU each process gets --threads threads (default 1: one core stands for one device, as one GPU per
process would), so DDP 2 vs DDP 1 shows the scaling a second device buys. Per strategy:

- tokens/s: real (non-pad) tokens of the global batches / wall time of a repeat of --steps steps, median over
  --repeats after one warm-up step;
- peak mem: the most any process grew during the steps (warm-up included): on CPU its peak RSS (VmHWM, reset
  before the first step) over its RSS then; on CUDA torch.cuda.max_memory_allocated over the memory allocated then;
- state: parameter + gradient + optimizer bytes one process holds (local shards of FSDP's DTensors; gradients
  counted as the bytes of the trainable parameters they mirror; DDP's bucket copy not counted).

    .venv/bin/python bench/strategies.py [--steps 2] [--repeats 3] [--only ddp2,fsdp2]

Last line: ``ratio <fsdp2 tokens/s / ddp2 tokens/s>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (processes, config overrides, what it is)
STRATEGIES: dict[str, tuple[int, list[str], str]] = {
    "ddp1": (1, [], "DDP, 1 process"),
    "ddp2": (2, [], "DDP, 2 processes"),
    "fsdp2": (2, ["train.strategy=fsdp", "train.fsdp_sharding=full_shard"], "FSDP full_shard, 2 processes"),
    "fsdp2_gc": (2, ["train.strategy=fsdp", "train.fsdp_sharding=full_shard", "train.gradient_checkpointing=true"],
                 "FSDP + gradient checkpointing, 2 proc"),
    "fsdp2_lora": (2, ["train.strategy=fsdp", "train.fsdp_sharding=full_shard", "train.lora=true"],
                   "FSDP + LoRA (family defaults), 2 proc"),
    "ddp1_8bit": (1, ["train.optimizer=adamw_8bit"], "DDP, 1 process, adamw_8bit"),
}
RESULT = "RESULT "


def global_batches(model, n: int, batch: int, frames: tuple[int, int], seed: int) -> list[list[dict]]:
    """``n`` global batches of ``batch`` examples (encoded, not collated) with random lengths: padding is real."""
    import numpy as np

    from voxrelay.data.shards import EncodedUtterance

    rng = np.random.default_rng(seed)
    return [[model.example(EncodedUtterance("x", "a sentence of about this many characters", None, None, 1.0,
                                            rng.integers(0, 256, (4, int(rng.integers(frames[0], frames[1] + 1))))))
             for _ in range(batch)] for _ in range(n)]


def _rss_reset() -> int:
    """Reset this process's peak RSS to its current RSS (Linux clear_refs 5); returns the RSS in bytes."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _status_kb("VmRSS") * 1024


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _local_bytes(t) -> int:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def state_bytes(module, optimizer) -> dict[str, int]:
    import torch

    params = list(module.parameters())
    opt = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
    opt_bytes = sum(_local_bytes(v) for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return {"params": sum(_local_bytes(p) for p in params),
            "grads": sum(_local_bytes(p) for p in params if p.requires_grad), "optim": opt_bytes}


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from accelerate import Accelerator

    from voxrelay.config import load_config
    from voxrelay.models.base import DataSpec
    from voxrelay.models.registry import build_model
    from voxrelay.train.build import bare_run
    from voxrelay.train.loop import train_step
    from voxrelay.train.state import seed_everything

    nproc, overrides, _ = STRATEGIES[args.worker]
    cuda = torch.cuda.is_available()
    torch.set_num_threads(args.threads)
    cfg = load_config(None, ["train.max_steps=100000", f"train.precision={args.precision}",
                             f"model.hidden_size={args.hidden}", f"model.num_layers={args.layers}",
                             f"model.intermediate_size={3 * args.hidden}", *overrides])
    accelerator = Accelerator(mixed_precision=cfg.train.precision, cpu=not cuda)  # as build_run
    rank, world = accelerator.process_index, accelerator.num_processes
    seed_everything(args.seed)
    model = build_model(cfg.model, DataSpec(4, 256), args.seed)
    run = bare_run(model, cfg, accelerator)
    module, optimizer = run.module, run.optimizer
    batches = global_batches(model, args.steps, args.batch, (args.min_frames, args.frames), args.seed)
    tokens = sum(len(e["input_ids"]) for b in batches for e in b)  # non-pad tokens of every process
    share = args.batch // world
    mine = [model.collate(b[rank * share:(rank + 1) * share]) for b in batches]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()
        accelerator.wait_for_everyone()

    sync()
    if cuda:
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = _rss_reset()
    train_step(run, [dict(mine[0], audio_seconds=1.0)])  # warm-up: allocates gradients and optimizer state
    times = []
    for _ in range(args.repeats):
        sync()
        t0 = time.perf_counter()
        for b in mine:
            train_step(run, [dict(b, audio_seconds=1.0)])
        sync()
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() if cuda else _status_kb("VmHWM") * 1024) - base
    mine_out = {"peak": peak, **state_bytes(module, optimizer)}
    per_rank = [mine_out]
    if world > 1:
        per_rank = [None] * world
        dist.all_gather_object(per_rank, mine_out)
    if rank == 0:
        out = {k: max(r[k] for r in per_rank) for k in mine_out}
        out |= {"name": args.worker, "procs": world, "tok_s": tokens / statistics.median(times),
                "trainable": sum(p.numel() for p in model.module.parameters() if p.requires_grad),
                "device": "cuda" if cuda else "cpu"}
        print(RESULT + json.dumps(out), flush=True)
    sync()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as Run.exit: gloo's exit-time destructors can abort a finished process


def launch(name: str, argv: list[str], threads: int) -> dict | str:
    """Run one strategy's worker(s); its RESULT dict, or the reason it gave none."""
    import torch

    nproc = STRATEGIES[name][0]
    if torch.cuda.is_available() and torch.cuda.device_count() < nproc:
        return f"skipped: needs {nproc} GPUs, {torch.cuda.device_count()} here"
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")) if p)
    if nproc == 1:
        cmd = [sys.executable, __file__]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", __file__]
    proc = subprocess.run([*cmd, *argv, "--worker", name], env=env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
    return f"failed (exit {proc.returncode}): " + " | ".join(tail)[-1500:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (after one warm-up step)")
    parser.add_argument("--batch", type=int, default=8, help="examples per global batch (even)")
    parser.add_argument("--frames", type=int, default=48, help="longest example, in codec frames (x4 tokens)")
    parser.add_argument("--min-frames", type=int, default=24, help="shortest example, in codec frames")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--precision", default="no", choices=["no", "bf16"])
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads per process (1: a core stands for a device)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=",".join(STRATEGIES),
                        help="comma-separated subset of: " + ", ".join(STRATEGIES))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.batch % 2:
        parser.error("--batch must be even (2-process strategies take half each)")
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        parser.error(f"unknown strategies {unknown}; choose from {list(STRATEGIES)}")
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("only", "worker")]
    results: dict[str, dict | str] = {}
    mib = 2**20
    print(f"{'strategy':<12} {'what':<38} {'tokens/s':>9} {'peak mem MiB':>12} {'state MiB':>9} "
          f"{'(params+grads+optim)':>22} {'trainable':>10}", flush=True)
    for name in names:
        started = time.perf_counter()
        r = launch(name, argv, args.threads)
        results[name] = r
        what = STRATEGIES[name][2]
        if isinstance(r, str):
            print(f"{name:<12} {what:<38} {r}", flush=True)
            continue
        split = f"{r['params'] / mib:.1f}+{r['grads'] / mib:.1f}+{r['optim'] / mib:.1f}"
        state = (r["params"] + r["grads"] + r["optim"]) / mib
        print(f"{name:<12} {what:<38} {r['tok_s']:>9.0f} {r['peak'] / mib:>12.1f} {state:>9.1f} {split:>22} "
              f"{r['trainable']:>10,}   ({time.perf_counter() - started:.0f} s)", flush=True)
    device = next((r["device"] for r in results.values() if isinstance(r, dict)), "?")
    print(f"device {device}; {args.threads} CPU thread(s) per process; global batch {args.batch} examples; "
          f"{args.steps} steps x {args.repeats} repeats (median) after 1 warm-up step; peak mem: most any process "
          f"grew ({'max_memory_allocated' if device == 'cuda' else 'peak RSS'}); state: per process (max)")
    ddp, fsdp = results.get("ddp2"), results.get("fsdp2")
    ratio = fsdp["tok_s"] / ddp["tok_s"] if isinstance(ddp, dict) and isinstance(fsdp, dict) else float("nan")
    print(f"ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
