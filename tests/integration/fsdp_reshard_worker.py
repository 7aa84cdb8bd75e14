"""Worker of test_fsdp.py's reshard test (run as a script, alone or under torchrun): ``save FOLDER`` trains a
tiny FSDP2-sharded Llama one AdamW step and saves it with DCP as voxrelay's sharded checkpoints do;
``load FOLDER`` builds it afresh, shards it over this run's processes and loads the checkpoint with
:func:`voxrelay.checkpoint.shard_saver.load_sharded`. Both then write the full model + optimizer state (gathered
on rank 0) to ``FOLDER/<mode>-full.pt`` for the test to compare."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from transformers import LlamaConfig, LlamaForCausalLM, LlamaPreTrainedModel

from voxrelay.checkpoint.shard_saver import Shards, load_sharded
from voxrelay.checkpoint.sharded import MODEL_KEY, OPTIM_KEY
from voxrelay.models.base import module_classes
from voxrelay.train.ranks import Ranks
from voxrelay.train.strategies import apply_fsdp, fsdp_mesh


def build(seed: int):
    torch.manual_seed(seed)
    module = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=64, vocab_size=97))
    layers = module_classes(module, LlamaPreTrainedModel._no_split_modules)
    module = apply_fsdp(module, layers, "full_shard", "no", False, fsdp_mesh("full_shard", "cpu"))
    return module, torch.optim.AdamW(module.parameters(), lr=1e-2)


def main(mode: str, folder: Path) -> None:
    if mode == "save":
        module, optimizer = build(seed=0)
        ids = torch.arange(24).reshape(2, 12) % 97
        module(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        model_sd, optim_sd = get_state_dict(module, optimizer)
        dcp.save({MODEL_KEY: model_sd, OPTIM_KEY: optim_sd}, checkpoint_id=str(folder))
    else:  # another init: whatever equals the saved state afterwards came from the checkpoint
        module, optimizer = build(seed=1)
        load_sharded(Shards(module, optimizer, False, Ranks.of_job()), folder)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(module, optimizer, options=full)
    if dist.get_rank() == 0:
        torch.save({"model": model_sd, "optim": optim_sd["state"], "world": dist.get_world_size()},
                   folder.parent / f"{mode}-full.pt")
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as Run.exit: gloo's exit-time destructors can abort a finished process ("terminate called
    # without an active exception", exit -6: seen once in a full-suite run)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
