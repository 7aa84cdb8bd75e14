"""The client of :mod:`tests.helpers.zygote`: start ``python -m voxrelay ARGS`` as a child of a zygote for the
command's environment, and handle it as a :class:`subprocess.Popen` (pid, pipes, poll/wait/kill, returncode).

Zygotes are kept per environment (a test's commands usually share one), a few environments at a time; each ends
with the test process. `train` commands take turns between two per environment, whose hash seeds differ as two
fresh processes' would: a run and its resume never share one.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

ZYGOTE = Path(__file__).with_name("zygote.py")
ENVIRONMENTS = 3  # environments with zygotes alive at once (each zygote holds ~0.5 GB until it ends)
PER_ENVIRONMENT = 2


def enabled() -> bool:
    return os.environ.get("VOXRELAY_TEST_FORK", "1") != "0" and sys.platform == "linux"


class Zygote:
    def __init__(self, env: dict, folder: str):
        self.path = os.path.join(folder, "zygote.sock")
        self.log = open(os.path.join(folder, "zygote.log"), "w+b")  # noqa: SIM115 (lives as long as the zygote)
        self.proc = subprocess.Popen([sys.executable, str(ZYGOTE), self.path], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self.log)
        self.ready: bool | None = None
        self.live = 0  # its commands still running: it is not stopped under them

    def wait_ready(self) -> bool:
        if self.ready is None:
            self.ready = self.proc.stdout.readline() == b"ready\n"
        return self.ready

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        self.log.close()

    def startup_error(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")


class Pool:
    def __init__(self):
        self.zygotes: OrderedDict[tuple, list[Zygote]] = OrderedDict()
        self.turn: dict[tuple, int] = {}
        self.lock = threading.Lock()
        self.folder: str | None = None  # made with the first zygote: a process that imports this and forks none
        # (or ends by os._exit, as a forked command does) leaves nothing behind

    def zygote(self, env: dict, train: bool = False) -> Zygote | None:
        """The zygote for ``env``: the first one, but for ``train`` commands the two in turn (a run and its
        resume do not share a hash seed; the second is started only for an environment's second `train`)."""
        key = tuple(sorted(env.items()))
        with self.lock:
            zygotes = self.zygotes.setdefault(key, [])
            self.zygotes.move_to_end(key)
            turn = 0
            if train:
                turn = self.turn[key] = self.turn.get(key, -1) + 1
            if len(zygotes) <= min(turn, PER_ENVIRONMENT - 1):
                self.folder = self.folder or tempfile.mkdtemp(prefix="vx-zygotes-")
                folder = tempfile.mkdtemp(dir=self.folder)
                zygotes.append(Zygote(env, folder))
            idle = [k for k, zs in self.zygotes.items() if k != key and not any(z.live for z in zs)]
            for old in idle[:max(0, len(self.zygotes) - ENVIRONMENTS)]:  # the least recently used first
                for z in self.zygotes.pop(old):
                    z.stop()
            chosen = zygotes[turn % len(zygotes)]
            return chosen if chosen.wait_ready() else None

    def stop(self) -> None:
        for zygotes in self.zygotes.values():
            for z in zygotes:
                z.stop()
        self.zygotes.clear()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


POOL = Pool()
atexit.register(POOL.stop)


class Forked:
    """A forked ``python -m voxrelay ARGS``, handled as :class:`subprocess.Popen` (``text=True``) handles one."""

    def __init__(self, zygote: Zygote, args: list[str], cwd: str | Path | None, stderr_to_stdout: bool,
                 script: str | None = None):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe() if not stderr_to_stdout else (None, out_w)
        stdin = os.open(os.devnull, os.O_RDONLY)
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn.connect(zygote.path)
        request = json.dumps({"args": list(args), "cwd": str(cwd or os.getcwd()), "script": script}).encode()
        socket.send_fds(self.conn, [request], [stdin, out_w, err_w])
        for fd in {stdin, out_w, err_w}:
            os.close(fd)
        self.replies = self.conn.makefile("r")
        line = self.replies.readline()
        if not line.startswith("pid "):
            raise RuntimeError(f"the zygote did not start the command: {line!r}\n{zygote.startup_error()}")
        self.pid = int(line.split()[1])
        self.zygote = zygote
        zygote.live += 1
        self.args = ["voxrelay", *args]
        self.stdout = open(out_r, errors="replace")  # noqa: SIM115 (the caller's, as Popen's)
        self.stderr = open(err_r, errors="replace") if err_r is not None else None  # noqa: SIM115
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.conn], [], [], 0)[0]:
            self._read_exit()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read_exit()
        return self.returncode

    def _read_exit(self) -> None:
        line = self.replies.readline()
        if not line.startswith("exit "):
            raise RuntimeError(f"the zygote lost command {self.pid}: {line!r}")
        self.returncode = os.waitstatus_to_exitcode(int(line.split()[1]))
        self.zygote.live -= 1
        self.replies.close()
        self.conn.close()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """Both outputs whole once the command ended; on timeout it is killed (as :func:`subprocess.run`)."""
        got: dict[str, str] = {}
        readers = [threading.Thread(target=lambda n=name, f=f: got.__setitem__(n, f.read()), daemon=True)
                   for name, f in (("out", self.stdout), ("err", self.stderr)) if f is not None]
        for r in readers:
            r.start()
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            raise
        finally:
            for r in readers:
                r.join()
        return got.get("out", ""), got.get("err")


def popen(args: list[str], env: dict, cwd: str | Path | None = None, stderr_to_stdout: bool = False):
    """``python -m voxrelay ARGS`` forked from a zygote for ``env``, or started afresh where forking is off or the
    zygote could not start (its own error is then the fresh process's to show)."""
    zygote = POOL.zygote(env, train=args[:1] == ["train"]) if enabled() else None
    if zygote is None:
        return subprocess.Popen([sys.executable, "-m", "voxrelay", *args], env=env, cwd=cwd, text=True,
                                errors="replace", stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if stderr_to_stdout else subprocess.PIPE,
                                start_new_session=True)
    return Forked(zygote, args, cwd, stderr_to_stdout)


def run(args: list[str], env: dict, cwd: str | Path | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess:
    proc = popen(args, env, cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(["voxrelay", *args], proc.returncode, out, err)
