"""Worker of test_fsdp.py's resume-values test (run as a script, alone or under torchrun), through voxrelay's own
trainer: ``train OUT overrides...`` trains a run to ``train.max_steps`` (its last checkpoint saved by the
sharded saver), ``resume OUT overrides...`` builds the run, which resumes from that checkpoint (voxrelay's
resume path: pick, fetch, ``load_sharded``) and trains nothing. Both then gather the full model and optimizer
state on rank 0 and write it to OUT for the test to compare."""

from __future__ import annotations

import sys

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from voxrelay.cli import demo_config_path
from voxrelay.config import load_config
from voxrelay.train.build import build_run
from voxrelay.train.loop import train


def main(mode: str, out: str, overrides: list[str]) -> None:
    run = build_run(load_config(demo_config_path(), overrides))
    if mode == "train":
        assert train(run).exit_code == 0
    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=run.base_hash is not None)
    model, optim = get_state_dict(run.module, run.optimizer, options=options)
    if run.accelerator.is_main_process:
        torch.save({"model": model, "optim": optim["state"], "step": run.loop.step, "resumed": run.resumed_from,
                    "world": run.accelerator.num_processes}, out)
    run.close(60)
    run.exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
