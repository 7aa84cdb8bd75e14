"""One writer per run, as users would hit it: a second `voxrelay train` of a live run (a Colab reconnect
beside the old runtime, a spot job restarted before the old VM is gone) on a local folder. It is refused
(exit 2) naming the holder, `--fresh` too (nothing is deleted); once
the holder is SIGKILLed the next session takes over at once on this machine, and on any machine once
the lease expires; `--take-over` fences a live holder, which then stops without writing."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.runner import CONFIG, Trainer, env_for, voxrelay
from tests.helpers.tiny import NO_EVALS, tiny
from voxrelay import storage
from voxrelay.checkpoint.manager import CheckpointManager
from voxrelay.checkpoint.stops import EXIT_PREEMPTED
from voxrelay.checkpoint.store import CommittedStore

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

ENDLESS = ("train.max_steps=100000", NO_EVALS, "train.log_every=1", "checkpoint.every_steps=2")


def _env(tmp_path: Path) -> dict:
    env = env_for(tmp_path / "cache")
    return env | {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "STORAGE_EMULATOR", "GCSFS_"))}


@pytest.fixture
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    kind = request.param
    return str(tmp_path / "root") if kind == "local" else request.getfixturevalue(f"{kind}_root")


def _committed(run_uri: str) -> list[int]:
    return [c.step for c in CommittedStore(storage.join(run_uri, "checkpoints")).list()]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _squashed(text: str) -> str:
    """Without any whitespace: log lines are wrapped at the console's width, wherever a path falls."""
    return "".join(text.split())


# the S3 and GCS servers: their conditional writes in tests/unit/storage/test_conditional.py, and leases taken,
# renewed and taken over once expired by two sweep workers in tests/integration/test_sweep.py
@pytest.mark.parametrize("root", ["local"], indirect=True)
def test_a_second_writer_is_refused_until_the_first_is_killed(tmp_path, root):
    env = _env(tmp_path)
    assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
    run_uri = storage.join(root, "runs", "leased")
    # a 9 s lease: renewed every 3 s, so a second session sees a renewal within seconds (60 s: up to 30 s)
    first = Trainer(root, env, "name=leased", "checkpoint.lease_seconds=9", *ENDLESS)
    try:
        deadline = time.monotonic() + 120
        while not _committed(run_uri):  # it has written to the run folder
            assert first.proc.poll() is None and time.monotonic() < deadline, first.output()
            time.sleep(0.05)
        second = voxrelay("train", CONFIG, *tiny(root, "name=leased", "checkpoint.lease_seconds=9", *ENDLESS), env=env)
        msg = _one_line(second.stderr)
        assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr
        assert f"host {socket.gethostname()}, pid {first.proc.pid}, since" in msg and "renewal #" in msg, msg
        assert "--take-over" in msg and run_uri in msg
        holder = json.loads(storage.read_text(storage.join(run_uri, "lease.json")))["token"]
        fresh = voxrelay("train", CONFIG, *tiny(root, "name=leased", "checkpoint.lease_seconds=9", *ENDLESS), "--fresh",
                         env=env)
        assert fresh.returncode == 2 and f"pid {first.proc.pid}" in _one_line(fresh.stderr), fresh.stderr
        assert "--fresh: deleting" not in fresh.stderr  # refused before deleting anything under the holder
        assert json.loads(storage.read_text(storage.join(run_uri, "lease.json")))["token"] == holder
        assert _committed(run_uri) and storage.exists(storage.join(run_uri, "config.yaml"))
        assert first.proc.poll() is None  # and the holder trains on
    finally:
        first.kill()  # SIGKILL: no release; the lease stays in the run folder, unexpired
    step = max(_committed(run_uri))
    third = voxrelay("train", CONFIG, *tiny(root, "name=leased", f"train.max_steps={step + 2}"), env=env)
    assert third.returncode == 0, third.stderr
    out = _squashed(third.stderr)
    assert f"pid{first.proc.pid}" in out and ":dead" in out  # gone from this machine: taken at once
    # the newest committed step, or a newer one the killed session had staged in this machine's cache
    # (same VOXRELAY_CACHE) and that this session uploaded before resuming from it (at max_steps or past it: then
    # nothing is left to train, and it says so)
    found = re.search(r"(from|is already trained to) step (\d+)", _one_line(third.stderr))
    assert found, third.stderr
    resumed = int(found.group(2))
    assert resumed >= step and resumed in _committed(run_uri), (resumed, step, third.stderr)
    said = "resuming {} from step {}" if resumed < step + 2 else "{} is already trained to step {}"
    assert _squashed(said.format(run_uri, resumed)) in out, third.stderr
    lease = json.loads(storage.read_text(storage.join(run_uri, "lease.json")))
    assert lease["released"] is True and lease["taken_from"]["pid"] == first.proc.pid


def test_take_over_fences_the_live_writer_which_stops_without_writing(tmp_path):
    root, env = str(tmp_path / "root"), _env(tmp_path)
    assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
    run_uri = storage.join(root, "runs", "fenced")
    args = ("name=fenced", "train.max_steps=100000", "checkpoint.lease_seconds=4", "checkpoint.every_steps=1",
            NO_EVALS, "train.log_every=1")
    first = Trainer(root, env, *args)
    second = None
    try:
        assert first.wait_step_lines(3, 120), first.output()
        second = Trainer(root, env, *args, "--take-over")
        code = first.proc.wait(timeout=180)  # fenced: it stops by itself
        token = json.loads(storage.read_text(storage.join(run_uri, "lease.json")))["token"]
        deadline = time.monotonic() + 180
        while token not in _writers(run_uri).values():  # the new writer's own first commit
            assert second.proc.poll() is None and time.monotonic() < deadline, second.output()
            time.sleep(0.05)
        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(timeout=120) == EXIT_PREEMPTED, second.output()
    finally:
        first.kill()
        if second is not None:
            second.kill()
    took = _squashed(second.output())
    assert _squashed(f"took over {run_uri} from host {socket.gethostname()}, pid {first.proc.pid}") in took, took
    out = _squashed(first.output())
    assert code == 2 and "anothersessiontookover" in out and "withoutsaving" in out, first.output()
    assert "trainedtostep" not in out, first.output()  # the run is the other session's now
    assert "runthesamecommandagaintoresume" in _squashed(second.output()), second.output()  # its SIGTERM stop
    resumed = int(re.search(r"from step (\d+)", _one_line(second.output())).group(1))
    writers = _writers(run_uri)
    assert all(w == token for step, w in writers.items() if step > resumed), (resumed, writers)  # none of the old
    assert max(writers) > resumed
    reader = CheckpointManager(run_uri, staging_dir=tmp_path / "verify")
    for step in writers:  # every file of every checkpoint is the one its manifest names: no mixed step
        assert reader.latest_valid(step)[0].step == step


def _writers(run_uri: str) -> dict[int, str]:
    return {c.step: c.manifest.get("writer") for c in CommittedStore(storage.join(run_uri, "checkpoints")).list()}


def _beside_a_renewing_vm(lease: Path, args: list[str], env: dict) -> subprocess.CompletedProcess:
    """`voxrelay ARGS` while another machine renews ``lease`` every second (its own schedule: a live holder)."""
    proc = subprocess.Popen([sys.executable, "-m", "voxrelay", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    while True:
        try:
            out, err = proc.communicate(timeout=1)
            return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            record = json.loads(lease.read_text())
            lease.write_text(json.dumps(record | {"seq": record["seq"] + 1}))


def test_a_lease_left_by_another_machine_blocks_until_it_expires(tmp_path):
    root, env = str(tmp_path / "root"), _env(tmp_path)
    assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
    run = Path(root) / "runs" / "elsewhere"
    run.mkdir(parents=True)
    left = {"token": "t0", "host": "spot-vm-7", "pid": 4242, "boot_id": "another-boot", "since": time.time() - 600,
            "renewed": time.time(), "expires": time.time() + 3, "ttl": 3, "seq": 9, "released": False,
            "command": "voxrelay train"}  # a VM's lease: its pid means nothing here
    (run / "lease.json").write_text(json.dumps(left))
    args = tiny(root, "name=elsewhere", "train.max_steps=2")
    # while that VM renews (its counter advances), the lease is live whatever its clock says
    refused = _beside_a_renewing_vm(run / "lease.json", ["train", CONFIG, *args], env)
    assert refused.returncode == 2 and "hostspot-vm-7,pid4242" in _squashed(refused.stderr), refused.stderr
    assert not (run / "checkpoints").exists() and not (run / "config.yaml").exists()  # it wrote nothing
    # the VM died: its counter stays put (its expiry still ahead by our clock) and is taken after its ttl
    (run / "lease.json").write_text(json.dumps(left | {"renewed": time.time(), "expires": time.time() + 3600}))
    res = voxrelay("train", CONFIG, *args, env=env)
    assert res.returncode == 0 and "spot-vm-7" in res.stderr and ":expired" in _squashed(res.stderr), res.stderr


def test_train_and_sweep_refuse_a_root_on_a_drive_mount_unless_one_machine_trains_it(tmp_path):
    """Issue 33 D5 as a Colab user meets it: the root is in a folder /proc/mounts lists as Colab's Drive (the
    recorded table's line, its mount point moved under tmp_path). `train` and `sweep` stop with exit 2 naming the
    mount and both fixes, writing nothing; with checkpoint.single_machine=true `train` goes past the lease (it then
    stops on the unprepared data, a different refusal)."""
    drive = tmp_path / "drive"
    (drive / "MyDrive").mkdir(parents=True)
    table = tmp_path / "mounts"
    table.write_text(f"overlay / overlay rw 0 0\ndrive {drive} fuse.drive rw,nosuid,nodev,relatime 0 0\n")
    env = _env(tmp_path) | {"VOXRELAY_MOUNTS_FILE": str(table)}
    root = str(drive / "MyDrive" / "tts")
    refused = voxrelay("train", CONFIG, *tiny(root), env=env, timeout=300)
    out = refused.stdout + refused.stderr
    assert refused.returncode == 2 and "Traceback" not in out, out
    assert "Google Drive mount" in out and "checkpoint.single_machine=true" in out and "root=gs://" in out, out
    assert not any(Path(root).rglob("*"))  # nothing written, not even the probe
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"base: {CONFIG}\nlist:\n  - {{train.lr: 0.001}}\n")
    refused = voxrelay("sweep", str(sweep), *tiny(root), env=env, timeout=300)
    assert refused.returncode == 2 and "Google Drive mount" in refused.stdout + refused.stderr
    allowed = voxrelay("train", CONFIG, *tiny(root, "checkpoint.single_machine=true"), env=env, timeout=300)
    out = " ".join((allowed.stdout + allowed.stderr).split())  # the log wraps long lines
    assert "Google Drive mount" in out and "single_machine: true" in out, out  # the warning, and on it went
    assert "prepare" in out and allowed.returncode == 2, out
