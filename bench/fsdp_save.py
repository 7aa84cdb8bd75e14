"""How long a checkpoint save blocks training under train.strategy=fsdp vs under ddp, for the same Llama on
2 CPU processes (gloo), measured side by side:

- ddp: rank 0 copies the whole model + optimizer state (staging and upload happen in a thread);
- fsdp sync (before ShardSaver): every rank's get_state_dict, a synchronous DCP write of its model + AdamW
  shards to local disk, sha256 of its own files;
- fsdp async (voxrelay's ShardSaver): every rank's get_state_dict and dcp.async_save's copy of its shards
  into memory; the write, sha256, gather and staging run in a thread (their time is reported too, as
  "in the background": the training thread waits for it only at the next save or the final one).

    .venv/bin/python bench/fsdp_save.py [--hidden 512] [--layers 8] [--repeats 2]

Last line: ``ratio <fsdp async blocking / ddp blocking>``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _model(hidden: int, layers: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    module = LlamaForCausalLM(LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=8,
                                          intermediate_size=4 * hidden, vocab_size=4096))
    return module


def _step(module, optimizer) -> None:
    import torch

    x = torch.randint(0, 4096, (1, 16))
    module(input_ids=x, labels=x).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    sys.path.insert(0, str(ROOT / "src"))
    from voxrelay.checkpoint.manager import CheckpointManager, model_writer, state_writer
    from voxrelay.checkpoint.shard_saver import Shards, ShardSaver
    from voxrelay.checkpoint.sharded import rank_files
    from voxrelay.checkpoint.store import sha256_file
    from voxrelay.train.ranks import Ranks

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    plain = _model(args.hidden, args.layers)
    params = sum(p.numel() for p in plain.parameters())
    optimizer = torch.optim.AdamW(plain.parameters())
    _step(plain, optimizer)
    ddp, fsdp = [], []
    for _ in range(args.repeats):  # ddp: rank 0's copies are what the training thread waits for
        t0 = time.perf_counter()
        model_writer(plain.state_dict()), state_writer(optimizer.state_dict())
        ddp.append(time.perf_counter() - t0)
    sharded = _model(args.hidden, args.layers)
    for layer in sharded.model.layers:
        fully_shard(layer)
    fully_shard(sharded)
    optimizer = torch.optim.AdamW(sharded.parameters())
    _step(sharded, optimizer)
    asyn, background = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            folder = Path(tmp) / str(i)
            dist.barrier()
            t0 = time.perf_counter()
            model_sd, optim_sd = get_state_dict(sharded, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))
            [sha256_file(p) for p in rank_files(folder, rank)]
            dist.barrier()
            fsdp.append(time.perf_counter() - t0)
        shards = Shards(sharded, optimizer, False, Ranks.of_job())
        checkpoints = CheckpointManager(str(Path(tmp) / "run"), staging_dir=Path(tmp) / "stg")
        saver = ShardSaver()
        for i in range(args.repeats + 1):  # the first one also makes the saver's gloo group: not counted
            dist.barrier()
            t0 = time.perf_counter()
            # what the training thread waits for
            saver.save(shards, checkpoints, i + 1, {"loop": {"step": i + 1}}, {}, 0)
            dist.barrier()
            t1 = time.perf_counter()
            saver.wait()  # write, sha256, gather, staged: in the saver's thread while training goes on
            if i:
                asyn.append(t1 - t0)
                background.append(time.perf_counter() - t1)
        if rank == 0:
            checkpoints.close(60)
    if rank == 0:
        print(f"{params / 1e6:.0f}M parameters, 2 processes: ddp blocks {min(ddp):.2f} s (rank 0 copy), "
              f"fsdp sync blocks {min(fsdp):.2f} s (sharded DCP write + sha256), fsdp async blocks "
              f"{min(asyn):.2f} s (copy of the shards; write + sha256 + staging {min(background):.2f} s in the "
              "background)")
        print(f"ratio {min(asyn) / min(ddp):.2f}")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if "RANK" in os.environ:
        worker(args)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
           *sys.argv[1:]]
    sys.exit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()
