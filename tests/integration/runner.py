"""Run `voxrelay` in child processes (as a user would, killable) and read back final weights."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import torch

from tests.integration.tiny import tiny
from voxrelay.checkpoint.manager import CheckpointManager
from voxrelay.cli import demo_config_path

CONFIG = str(demo_config_path())


def env_for(cache: Path, extra: dict | None = None) -> dict:
    # one thread per process: the same arithmetic in every run, whatever the machine load
    return dict(os.environ, VOXRELAY_CACHE=str(cache), OMP_NUM_THREADS="1", **(extra or {}))


def voxrelay(*args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voxrelay", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def torchrun(nproc: int, *args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "voxrelay", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


class Trainer:
    """A `voxrelay train` child process whose output lines are collected as they come."""

    def __init__(self, root: str, env: dict, *overrides: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "voxrelay", "train", CONFIG, *tiny(root, *overrides)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: list[str] = []
        self.first_step = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("step "):
                self.first_step.set()
        self.first_step.set()  # the process ended (finished or failed) without a step line

    def output(self) -> str:
        return "".join(self.lines)


def final_weights(run_uri: str, staging: Path) -> tuple[int, dict[str, torch.Tensor]]:
    ckpt, weights = CheckpointManager(run_uri, staging_dir=staging).load_model()
    return ckpt.step, weights


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"
