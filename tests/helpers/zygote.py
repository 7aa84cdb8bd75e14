"""``python -m voxrelay ARGS`` without paying the imports each time: a forking interpreter for the test suite.

A `voxrelay` process spends ~6.5 of its first seconds importing torch and transformers; the suite starts hundreds.
A zygote is an interpreter started exactly as ``python -m voxrelay`` would be (the same executable, the same
environment), that runs what the CLI does before any library import (:func:`voxrelay.cli.app.setup_environment`:
the libraries read those variables once, at import), imports the heavy modules, and then waits. For each command
it forks a child that becomes ``python -m voxrelay ARGS`` in the given folder, with the caller's pipes as its
stdin/stdout/stderr, in a session of its own (so a test can SIGKILL its whole process tree), and ends as an
interpreter is seen to end from outside (:func:`_run`: non-daemon threads joined, atexit handlers, an uncaught
exception printed and exit 1), without tearing down the imported modules.

What a child shares with its siblings and a fresh process would not: the hash seed (so :mod:`tests.helpers.forked`
gives `train` commands two zygotes per environment in turn: a run and its resume get different ones) and numpy's
global generator (reseeded in the child); ``voxrelay.IMPORTED_AT``/``PARENT_AT_IMPORT`` are set again as a fresh
import sets them.
The modules imported are those every training command imports (never peft, which the chunked loss looks for in
``sys.modules``). ``VOXRELAY_TEST_FORK=0`` turns it off (every command a fresh process).

Protocol over a Unix socket, one connection per command: the client sends one JSON line (``args``, ``cwd``; or a
``script`` to run instead, for the helper's own tests) with
its three pipe ends as SCM_RIGHTS; the zygote answers ``pid <n>`` and, when the child ends, ``exit <waitstatus>``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import sys
from pathlib import Path

PRELOAD = ("torch", "transformers.modeling_utils", "voxrelay.cli", "voxrelay.train.build", "voxrelay.train.loop")
NEVER = ("peft",)  # modules whose presence changes what a command does (see the module's docstring)


def _serve(path: str) -> dict | None:
    """The zygote's loop; returns a request in each forked child (None: the zygote should exit)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    parent = os.getppid()
    waiting: dict[int, socket.socket] = {}  # child pid -> its client's connection
    wake_r, wake_w = socket.socketpair()  # a child's end wakes the loop at once
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while os.getppid() == parent:  # the test process is gone: so is the zygote
        readable, _, _ = select.select([listener, wake_r], [], [], 1.0)
        with contextlib.suppress(BlockingIOError):
            wake_r.recv(4096)
        _reap(waiting)
        if listener not in readable:
            continue
        conn, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()  # the imported objects stay shared with the child: its collections never visit (copy) them
        _check_one_thread()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            wake_r.close()
            wake_w.close()
            listener.close()
            for other in waiting.values():
                other.close()
            conn.close()
            return {**json.loads(message), "fds": fds}
        for fd in fds:
            os.close(fd)
        conn.sendall(f"pid {pid}\n".encode())
        waiting[pid] = conn
    return None


def _reap(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"exit {status}\n".encode())
            except OSError:  # the client gave up on it
                pass
            conn.close()


def _become(request: dict) -> str | None:
    """In the forked child: become ``python -m voxrelay ARGS`` run in ``cwd`` with the client's pipes (or
    ``python SCRIPT ARGS``: the helper's own tests look inside a child with a script)."""
    os.setsid()
    for target, fd in enumerate(request["fds"]):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    sys.path[0] = os.getcwd()  # `python -m` puts the current folder first
    import numpy

    import voxrelay

    numpy.random.seed()  # a fresh process seeds it from the OS
    voxrelay.IMPORTED_AT = __import__("time").time()
    voxrelay.PARENT_AT_IMPORT = os.getppid()
    sys.argv = ["-m", *request["args"]]
    return request.get("script")


def _preload() -> None:
    from voxrelay.cli.app import setup_environment

    # pyarrow's jemalloc starts a background thread when it loads: a process that forks must have one thread (a
    # child of a multi-threaded parent may only make async-signal-safe calls; CI saw forked `train` commands die
    # of SIGSEGV). Its purging thread off: jemalloc purges in the allocating threads instead, as it does by default.
    os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")
    setup_environment()
    for name in PRELOAD:
        __import__(name)
    loaded = [name for name in NEVER if name in sys.modules]
    assert not loaded, f"the zygote's imports brought in {loaded}, which changes what commands do"
    _check_one_thread()


def _check_one_thread() -> None:
    """Fork only a process with one thread: fail loudly when an import starts one (name it) rather than fork it."""
    tasks = os.listdir("/proc/self/task")
    if len(tasks) != 1:
        names = sorted(Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in tasks)
        raise RuntimeError(f"the zygote has {len(tasks)} threads after its imports ({', '.join(names)}): forking it "
                           "would hand children a broken copy; stop that thread from starting before the fork")


def _run(script: str | None) -> None:
    """``python -m voxrelay``, then the interpreter's exit as a fresh process's is seen from outside: non-daemon
    threads joined, atexit handlers run (logging's flush, weakref finalizers, tempfile clean-up), what the command
    left unreachable collected (its finalizers run), stdout/stderr flushed, the exit code of ``SystemExit`` (a
    message printed, 1), an uncaught exception's traceback and 1, Ctrl-C's death by SIGINT. Not run: the
    tear-down of the imported modules, ~1 s of copying the pages they share with the zygote for nothing a test
    can see (an object still reachable from a module at exit is not finalized)."""
    import atexit
    import runpy
    import threading
    import traceback

    code = 0
    try:
        if script is None:
            runpy._run_module_as_main("voxrelay")  # what `python -m voxrelay` runs
        else:
            sys.argv[0] = script
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 (shown as the interpreter shows it)
        traceback.print_exc()
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # not this file's folder (then PYTHONPATH's, as `python -m` has them); each child its own
    _preload()
    request = _serve(sys.argv[1])
    if request is None:
        sys.exit(0)
    _run(_become(request))
