"""The suite's forked `voxrelay` commands (tests/helpers/zygote.py) behave as fresh ``python -m voxrelay``
processes seen from outside: exit codes and both outputs, the working folder, the environment the process was
given (never another test's), a process of its own that SIGKILL ends (reported as -9, like Popen), and siblings
that do not share a hash seed or numpy's random state in turn."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import forked

pytestmark = [pytest.mark.slow,  # each environment starts interpreters (~6 s each)
              pytest.mark.skipif(not forked.enabled(), reason="forking is off (VOXRELAY_TEST_FORK=0) or not Linux")]

PROBE = """
import json, os, sys
import numpy
print(json.dumps({"cwd": os.getcwd(), "path0": sys.path[0], "mark": os.environ.get("MARK"),
                  "hash": hash("voxrelay"), "numpy": float(numpy.random.random()), "sid": os.getsid(0) == os.getpid(),
                  "argv0": sys.argv[0]}))
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict:  # one environment: its zygotes serve every test here
    return dict(os.environ, VOXRELAY_CACHE=str(tmp_path_factory.mktemp("cache")), MARK="this")


def test_a_forked_command_is_the_cli_with_its_exit_code_outputs_and_folder(env, tmp_path: Path):
    bad = forked.run(["plan", "missing.yaml"], env, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stdout == "", bad
    assert "CONFIG 'missing.yaml' cannot be read" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    (tmp_path / "missing.yaml").write_text("name: [unclosed\n")  # now it exists in that folder: another error
    assert "missing.yaml" in forked.run(["plan", "missing.yaml"], env, cwd=tmp_path).stderr
    version = forked.run(["--version"], env)
    assert (version.returncode, version.stdout) == (0, "voxrelay 0.1.0\n"), version


def test_it_runs_in_a_session_of_its_own_that_sigkill_ends(env, tmp_path: Path):
    proc = forked.popen(["doctor", "--help"], env, stderr_to_stdout=True)
    assert proc.wait(60) == 0 and "doctor" in proc.stdout.read()
    script = tmp_path / "pause.py"
    script.write_text("import signal\nprint('waiting', flush=True)\nsignal.pause()\n")
    stuck = forked.Forked(forked.POOL.zygote(env), [], tmp_path, stderr_to_stdout=True, script=str(script))
    assert stuck.stdout.readline() == "waiting\n"  # running, and it would wait forever
    assert stuck.poll() is None and os.getsid(stuck.pid) == stuck.pid != os.getsid(0)
    os.kill(stuck.pid, signal.SIGKILL)
    assert stuck.wait(60) == -signal.SIGKILL and stuck.stdout.read() == ""


def test_each_environment_gets_its_own_interpreter_and_siblings_differ_in_seeds(env, tmp_path: Path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    seen = []
    for other in (env, dict(env, MARK="other")):
        for _ in range(2):
            zygote = forked.POOL.zygote(other, train=True)
            out = _fork_script(zygote, script, tmp_path)
            seen.append(out)
    marks = [s["mark"] for s in seen]
    assert marks == ["this", "this", "other", "other"]
    assert all(s["cwd"] == str(tmp_path) == s["path0"] and s["sid"] for s in seen)
    assert seen[0]["hash"] != seen[1]["hash"] and seen[0]["numpy"] != seen[1]["numpy"]


def _fork_script(zygote: forked.Zygote, script: Path, cwd: Path) -> dict:
    import json

    proc = forked.Forked(zygote, [], cwd, stderr_to_stdout=False, script=str(script))
    out, err = proc.communicate(60)
    assert proc.returncode == 0, err
    return json.loads(out)


def test_forking_can_be_turned_off(env, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("VOXRELAY_TEST_FORK", "0")
    proc = forked.popen(["--version"], env)
    assert isinstance(proc, subprocess.Popen) and proc.args[:3] == [sys.executable, "-m", "voxrelay"]
    assert proc.communicate(120)[0] == "voxrelay 0.1.0\n"


def test_an_interpreter_is_never_stopped_under_a_running_command(env, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(forked, "ENVIRONMENTS", 1)  # one environment's interpreters alive at a time, if idle
    script = tmp_path / "pause.py"
    script.write_text("import signal\nprint('waiting', flush=True)\nsignal.pause()\n")
    running = forked.Forked(forked.POOL.zygote(env), [], tmp_path, stderr_to_stdout=True, script=str(script))
    assert running.stdout.readline() == "waiting\n"
    assert forked.run(["--version"], dict(env, MARK="another")).returncode == 0  # a second environment comes
    assert running.zygote.proc.poll() is None and running.poll() is None  # kept: it has a command running
    running.kill()
    assert running.wait(60) == -signal.SIGKILL
    forked.run(["--version"], dict(env, MARK="a third"))
    assert running.zygote.proc.poll() is not None  # idle now: stopped for the newer environment
