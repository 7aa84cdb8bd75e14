"""Issue 33 "orphans": a training process started by torchrun/accelerate (in a session of its own) stops, as on
SIGTERM, when its launcher dies, also when the launcher died before it asked to be told (voxrelay.checkpoint.host)."""

from __future__ import annotations

import os
import subprocess
import sys

from voxrelay.checkpoint.host import stop_with_launcher

# a worker: SIGTERM is what voxrelay's preemption watcher turns into save-and-stop; here it is just reported
WORKER = """
import os, signal, sys, threading
import voxrelay
from voxrelay.checkpoint.host import stop_with_launcher
got = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: got.set())
parent = voxrelay.PARENT_AT_IMPORT + int(sys.argv[1])  # argv[1] != 0: as if the launcher changed before the call
assert stop_with_launcher(parent)
print("ready", flush=True)
got.wait(60)
print("SIGTERM" if got.is_set() else "no signal", flush=True)
"""
# a launcher as torchrun starts its workers: in a session of their own, so a SIGKILL of it does not reach them
LAUNCHER = """
import subprocess, sys, threading
subprocess.Popen([sys.executable, "-c", sys.argv[1], "0"], start_new_session=True)
threading.Event().wait()
"""


def _env() -> dict:
    return os.environ | {"LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "test"}


def test_a_worker_gets_sigterm_when_its_launcher_is_sigkilled() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, WORKER], stdout=subprocess.PIPE, text=True,
                                env=_env())
    try:
        assert launcher.stdout.readline().strip() == "ready"
        launcher.kill()
        launcher.wait(60)
        assert launcher.stdout.readline().strip() == "SIGTERM"  # the worker's line, through the inherited pipe
    finally:
        launcher.kill()
        launcher.stdout.close()


def test_a_launcher_dead_before_the_worker_asked_is_noticed() -> None:
    """The parent changed between the worker's start and its request: no death signal would ever come."""
    done = subprocess.run([sys.executable, "-c", WORKER, "1"], capture_output=True, text=True, env=_env(), timeout=120)
    assert done.stdout.split() == ["ready", "SIGTERM"], done.stderr


def test_outside_a_launcher_nothing_is_asked() -> None:
    assert stop_with_launcher(os.getppid() + 1, environ={}) is False  # a plain `voxrelay train`: no signal to self
