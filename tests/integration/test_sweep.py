"""`voxrelay sweep` as users run it: two workers on one sweep against the S3 and the GCS test servers, one
SIGKILLed mid-run as a lost machine would be. Every experiment ends exactly once; the killed worker's
experiment is resumed by the other once its lease expires (the killed worker runs in a pid namespace of its
own, as on another machine: its death cannot be seen from here, only its lease running out)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.runner import CONFIG, _kill_tree, env_for, voxrelay
from tests.helpers.tiny import NO_EVALS, tiny
from voxrelay import storage
from voxrelay.checkpoint.store import CommittedStore

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

LONG, SHORT = 60, 6  # steps of the experiment that is killed (it must outlast the wait for its first commit)


def _own_pid_namespace() -> bool:
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True) if os.path.exists(
        "/usr/bin/unshare") else None
    return probe is not None and probe.returncode == 0


class Worker:
    """A `voxrelay sweep` process (its output collected as it comes), optionally in a pid namespace of its own."""

    def __init__(self, args: list[str], env: dict, isolated: bool = False):
        cmd = [sys.executable, "-m", "voxrelay", "sweep", *args]
        self.proc = subprocess.Popen((["unshare", "--pid", "--fork"] if isolated else []) + cmd, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    def output(self) -> str:
        return "".join(self.lines)

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(30)
        return code


def _committed(run: str) -> list[int]:
    return [c.step for c in CommittedStore(storage.join(run, "checkpoints")).list()]


def _until(what, timeout: float, *workers: Worker) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "\n".join(w.output() for w in workers)
        time.sleep(0.05)


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_two_workers_one_killed_every_experiment_ends_exactly_once(tmp_path, request, kind):
    root = request.getfixturevalue(f"{kind}_root")
    env = env_for(tmp_path / "cache") | {k: v for k, v in os.environ.items()
                                         if k.startswith(("AWS_", "STORAGE_EMULATOR", "GCSFS_"))}
    assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
    sweep_file = tmp_path / "lr.yaml"
    sweep_file.write_text(yaml.safe_dump({"base": CONFIG, "list": [
        {"train.lr": 1.0e-3, "train.optimizer": "lion", "train.max_steps": LONG}, {"train.lr": 3.0e-4}]}))
    args = [str(sweep_file), *tiny(root, f"train.max_steps={SHORT}", "checkpoint.lease_seconds=6",
                                   NO_EVALS, "checkpoint.every_steps=2", "train.log_every=1")]
    isolated = _own_pid_namespace()
    # another machine: its own pid namespace and its own local cache (its staged checkpoints are not here)
    first = Worker(args, env | {"VOXRELAY_CACHE": str(tmp_path / "cache-first")}, isolated=isolated)
    second = None
    try:
        queue = storage.join(root, "sweeps", "lr", "queue.json")
        _until(lambda: storage.exists(queue), 120, first)
        names = [e["name"] for e in json.loads(storage.read_text(queue))["experiments"]]
        killed = storage.join(root, "runs", names[0])  # lr 1e-3, lion, LONG steps: the first worker's first
        _until(lambda: storage.exists(storage.join(killed, "lease.json")), 120, first)
        second = Worker(args, env)  # it finds the first experiment taken and starts on the next
        _until(lambda: _committed(killed), 120, first)
    finally:
        _kill_tree(first.proc.pid)  # the first machine is lost: the worker and its trainer at once
    first.finish(30)
    at_kill = max(_committed(killed))
    assert at_kill < LONG, first.output()
    assert second.finish(300) == 0, second.output()

    out, later = _squashed(first.output() + second.output()), _squashed(second.output())
    for name, max_steps in zip(names, (LONG, SHORT), strict=True):  # each ended once, by one worker
        assert len(re.findall(rf"trainedtostep{max_steps};runfolder\S*/runs/{re.escape(name)}(?![-\w])", out)) == 1
        assert max(_committed(storage.join(root, "runs", name))) == max_steps
    assert f"experiment{names[0]}" in _squashed(first.output())
    # the second worker first touched it to resume it, after another one (it was held while its lease lived)
    mentions = [m.end() for m in re.finditer(rf"experiment{re.escape(names[0])}\(", later)]
    assert mentions and later[mentions[0]:].split(":", 1)[1].startswith("resuming"), second.output()
    assert later.index(f"experiment{names[1]}") < mentions[0]
    resumed = int(re.search(rf"resuming\S*/runs/{names[0]}fromstep(\d+)", later).group(1))
    assert resumed == at_kill  # from the killed worker's last commit
    lease = json.loads(storage.read_text(storage.join(killed, "lease.json")))
    assert lease["released"] and lease["taken_from"]["state"] == ("expired" if isolated else "dead"), lease
    status = voxrelay("sweep", "status", *args, env=env)
    assert status.returncode == 0 and "2 of 2 ended, 0 running, 0 failed" in status.stdout, status.stdout
    assert storage.exists(storage.join(root, "sweeps", "lr", "eval.png")), status.stderr


def _squashed(text: str) -> str:
    """Without whitespace: log lines are wrapped at the console's width wherever a name falls."""
    return "".join(text.split())


def test_a_killed_worker_takes_its_trainer_with_it(tmp_path):
    """The trainer child runs in a session of its own (a Ctrl-C reaches it once, forwarded): were the worker
    SIGKILLed alone, the child must not train on, holding the run's lease."""
    marker, trainer = tmp_path / "child.pid", tmp_path / "trainer.py"
    trainer.write_text(f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    script = f"import sys; from voxrelay.sweep.worker import Child; Child([sys.executable, {str(trainer)!r}]).run()"
    worker = subprocess.Popen([sys.executable, "-c", script])
    _until(lambda: marker.exists() and marker.read_text(), 60)
    child = int(marker.read_text())
    assert Path(f"/proc/{child}").exists()
    worker.kill()
    worker.wait()
    _until(lambda: not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2],
           30)


def test_a_failed_experiment_is_recorded_skipped_and_retried_on_request(tmp_path):
    root, env = str(tmp_path / "root"), env_for(tmp_path / "cache")
    assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
    sweep_file = tmp_path / "mixed.yaml"
    sweep_file.write_text(yaml.safe_dump({"base": CONFIG, "list": [
        {"model.init_from": str(tmp_path / "no-such-model")}, {"train.lr": 1.0e-3}]}))
    args = [str(sweep_file), *tiny(root, "train.max_steps=2", NO_EVALS)]
    first = voxrelay("sweep", *args, env=env)
    assert first.returncode == 1, first.stdout + first.stderr
    out = _squashed(first.stdout + first.stderr)
    assert "1failed:mixed-init_from" in out and "--retry-failed" in out
    status = voxrelay("sweep", "status", *args, env=env)
    lines = {line.split()[0]: line for line in status.stdout.splitlines()[1:-1]}
    failed, done = (lines[n] for n in sorted(lines))  # mixed-init_from-..., mixed-lr-...
    assert "failed (exit 2: refused: error:" in failed and "no-such-model" in failed, status.stdout
    assert re.search(r"finished +2/2", done) and "2 of 2" not in status.stdout and "1 failed" in status.stdout
    again = voxrelay("sweep", *args, env=env)  # a new session: the failure is not retried by itself
    assert again.returncode == 1 and "starting" not in again.stderr + again.stdout, again.stderr
    retried = voxrelay("sweep", *args, "--retry-failed", env=env)
    tried = _squashed(retried.stdout + retried.stderr)
    assert retried.returncode == 1 and tried.count("):starting") == 1 and "mixed-init_from" in tried, tried
