"""Run `voxrelay` in child processes (as a user would, killable) and read back final weights."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from tests.helpers import forked
from tests.helpers.tiny import NO_EVALS, NO_SAVES, tiny
from voxrelay.checkpoint.manager import CheckpointManager
from voxrelay.cli import demo_config_path
from voxrelay.paths import uri_key

CONFIG = str(demo_config_path())
STEP_LINE = re.compile(r"^step (\d+)/")
# storage errors surface at once instead of after the client's own retries (outage tests)
FAST_FAIL = {"AWS_MAX_ATTEMPTS": "1", "VOXRELAY_RETRY_ATTEMPTS": "1"}


def env_for(cache: Path, extra: dict | None = None) -> dict:
    # one thread per process: the same arithmetic in every run, whatever the machine load
    return dict(os.environ, VOXRELAY_CACHE=str(cache), OMP_NUM_THREADS="1", **(extra or {}))


def voxrelay(*args: str, env: dict, timeout: float = 600, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """``python -m voxrelay ARGS`` in a process of its own (forked from a pre-imported interpreter: see
    :mod:`tests.helpers.zygote`), its output captured."""
    return forked.run(list(args), env, cwd=cwd, timeout=timeout)


def torchrun(nproc: int, *args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "voxrelay", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def node_launcher(node: int, nodes: int, port: int, nproc: int = 1, hide: list[Path] = ()) -> list[str]:
    """The command (up to ``-m voxrelay``) of node ``node`` of a job over ``nodes`` machines, simulated on 127.0.0.1:
    torchrun with a static rendezvous at ``port``. ``hide``: folders this node must not see (the other nodes'
    local disks): in a mount namespace of its own each is covered by an empty tmpfs, so a file this node writes
    there never reaches the other node (needs ``unshare``: see :func:`can_hide_folders`)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--node-rank={node}",
           f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1", f"--master-port={port}"]
    if not hide:
        return cmd
    mounts = " && ".join(f"mkdir -p '{p}' && mount -t tmpfs tmpfs '{p}'" for p in hide)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh", *cmd]


def can_hide_folders() -> bool:
    """True where :func:`node_launcher` can hide folders (root, or user namespaces, and util-linux's unshare)."""
    import shutil

    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


def in_mount_namespace(setup: str, args: list[str], env: dict, log: Path, after: str = "true",
                       timeout: float = 300) -> tuple[int, str, str]:
    """``voxrelay ARGS`` after the shell commands ``setup`` (mounts: a small tmpfs, a read-only bind) in a mount
    namespace of its own, where the mounts vanish with it (needs what :func:`can_hide_folders` checks):
    (exit code, its output (kept in ``log``), what the shell commands ``after`` print there afterwards)."""
    script = f'set -e; {setup}; set +e; "$@" > "{log}" 2>&1; rc=$?; {after}; exit $rc'
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                          sys.executable, "-m", "voxrelay", *args], env=env, capture_output=True, text=True,
                         errors="replace", timeout=timeout)
    return res.returncode, log.read_text(errors="replace") + res.stderr, res.stdout


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Trainer:
    """A `voxrelay train` child process (with ``nproc`` > 1 a torchrun job) in a session of its
    own, whose output lines (stdout and stderr) are collected as they come."""

    def __init__(self, root: str, env: dict, *overrides: str, nproc: int = 1, config: str = CONFIG,
                 settings=tiny, launcher: list[str] | None = None):  # noqa: ANN001 (settings: (root, *overrides) -> overrides)
        command = ["train", config, *settings(root, *overrides)]
        if launcher is None and nproc == 1:  # forked from a pre-imported interpreter (tests.helpers.zygote)
            self.proc = forked.popen(command, env, stderr_to_stdout=True)
        else:  # launcher: e.g. node_launcher(), one node of a job over several
            start = launcher if launcher is not None else [
                sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
            self.proc = subprocess.Popen(
                [*start, "-m", "voxrelay", *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, start_new_session=True,
            )
        self.lines: list[str] = []
        self.first_step = threading.Event()
        self._printed = threading.Condition()
        self._step_lines = 0
        self._ended = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("step "):
                self.first_step.set()
                with self._printed:
                    self._step_lines += 1
                    self._printed.notify_all()
        self.first_step.set()  # the process ended (finished or failed) without a step line
        with self._printed:
            self._ended = True
            self._printed.notify_all()

    def wait_step_lines(self, count: int, timeout: float) -> bool:
        """Wait until this session printed ``count`` step lines; False if it ended or timed out first."""
        with self._printed:
            self._printed.wait_for(lambda: self._step_lines >= count or self._ended, timeout)
            return self._step_lines >= count

    def kill(self) -> None:
        """SIGKILL the job as a lost machine would: every process of it at the same moment (a no-op
        once it ended), then reap it."""
        if self.proc.poll() is None:  # once reaped, its pid may belong to another process
            _kill_tree(self.proc.pid)
        self.proc.wait()
        self._reader.join(30)  # the pipe closes with the last process: every line is in self.lines
        assert not self._reader.is_alive(), "a process of the job outlived SIGKILL"

    def steps(self) -> list[int]:
        """The steps of the progress lines printed so far (``step N/M | ...``)."""
        return [int(m.group(1)) for m in map(STEP_LINE.match, list(self.lines)) if m]

    def output(self) -> str:
        return "".join(self.lines)


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc)."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in children.read_text().split()]
    return tree


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants. torchrun starts its workers in sessions of their own,
    so each process group of the tree is first frozen (SIGSTOP: none sees another die and reacts,
    none starts a new process), then killed."""
    frozen: list[int] = [os.getpgrp()]  # never the test's own group
    while new := [g for g in dict.fromkeys(_groups(_process_tree(pid))) if g not in frozen]:
        for group in new:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGSTOP)
        frozen += new
    for group in frozen[1:]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def _groups(pids: list[int]) -> list[int]:
    groups = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            groups.append(os.getpgid(pid))
    return groups


def staging_dir(cache: Path, run_uri: str) -> Path:
    """Where `voxrelay train` with ``VOXRELAY_CACHE=cache`` stages the checkpoints of ``run_uri``."""
    return cache / "staging" / uri_key(run_uri)


def staged_steps(folder: Path) -> list[int]:
    """Steps of the complete staged checkpoints in ``folder`` (``step-N/`` with its manifest), ascending."""
    return sorted(int(p.parent.name[5:]) for p in folder.glob("step-*/manifest.json"))


def kill_once_a_checkpoint_exists(trainer: Trainer, cache: Path, run_uri: str, steps: int) -> None:
    """SIGKILL ``trainer`` as soon as a checkpoint of it exists, staged on this machine or committed (the resume
    takes either), while it still has steps to train (of ``steps``)."""
    while not (staged_steps(staging_dir(cache, run_uri)) or list(Path(run_uri).glob("checkpoints/*/manifest.json"))):
        assert trainer.proc.poll() is None and trainer.wait_step_lines(len(trainer.steps()) + 1, 600), trainer.output()
    trainer.kill()
    assert trainer.steps() and trainer.steps()[-1] < steps, trainer.output()


def session_seconds(train_args: list[str], env: dict) -> float:
    """Wall seconds of a short `voxrelay train` session on this host (imports, start-up, 2 steps, the final
    save): what time-limit tests scale their limits by, so that a loaded or slow host passes too."""
    t0 = time.monotonic()
    res = voxrelay("train", CONFIG, *train_args, "train.max_steps=2", NO_EVALS,
                   NO_SAVES, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return time.monotonic() - t0


def final_weights(run_uri: str, staging: Path) -> tuple[int, dict[str, torch.Tensor]]:
    step, weights, _ = final_checkpoint(run_uri, staging)
    return step, weights


def final_checkpoint(run_uri: str, staging: Path) -> tuple[int, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Step, weights and the family's extra state (e.g. an EMA) of the run's newest valid checkpoint."""
    ckpt, weights, family = CheckpointManager(run_uri, staging_dir=staging).load_model()
    return ckpt.step, weights, family


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"
