"""The network to the bucket goes away mid-run: training goes on, checkpoints stay staged on local
disk, and once the network is back the ones made during the outage are committed. A signal makes
the run save, wait for the upload and exit with its code.

The outage is a TCP proxy in front of the S3 server that is cut and restored
(tests/helpers/proxy.py): the bucket keeps its content, as in a real network outage.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.proxy import TcpProxy, s3_env_through
from tests.helpers.runner import (
    CONFIG,
    FAST_FAIL,
    Trainer,
    env_for,
    final_weights,
    staged_steps,
    staging_dir,
    voxrelay,
)
from tests.helpers.servers import HOST
from tests.helpers.tiny import NO_EVALS, NO_SAVES, tiny
from voxrelay import storage
from voxrelay.checkpoint.stops import EXIT_PREEMPTED
from voxrelay.checkpoint.store import MANIFEST, CommittedStore, sha256_file

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py


def _env(tmp_path, fast_fail: bool = True) -> dict:
    env = env_for(tmp_path / "cache")
    env |= {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "STORAGE_EMULATOR", "GCSFS_"))}
    return env | (FAST_FAIL if fast_fail else {})


def _last_step(trainer: Trainer) -> int:
    steps = trainer.steps()
    return steps[-1] if steps else 0


def _wait_until(condition, trainer: Trainer, what: str, timeout: float = 120) -> None:
    """Poll ``condition`` (a few ms apart) until it holds; fail naming ``what`` if the trainer
    ended or ``timeout`` ran out first."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert trainer.proc.poll() is None, f"the trainer ended before {what}:\n{trainer.output()}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f}s:\n{trainer.output()}"
        time.sleep(0.01)


def test_proxy_cut_refuses_and_resets_then_restore_listens_again(s3_server):
    with TcpProxy(s3_server.port) as proxy:
        with urllib.request.urlopen(f"{proxy.endpoint}/moto-api/", timeout=10) as resp:
            assert resp.status == 200  # forwarded to the server
        # open, nothing sent yet (accepted by the proxy, or still in its listen queue: reset either way)
        idle = socket.create_connection((HOST, proxy.port), timeout=10)
        proxy.cut()
        assert not [t for t in threading.enumerate() if t.name.endswith(f"-{proxy.port}")]  # all ended
        with pytest.raises(ConnectionResetError):
            idle.recv(1)
        idle.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((HOST, proxy.port), timeout=10)
        proxy.restore()
        with urllib.request.urlopen(f"{proxy.endpoint}/moto-api/", timeout=10) as resp:
            assert resp.status == 200


def test_outage_checkpoints_staged_during_it_are_committed_after(tmp_path, s3_root, s3_server):
    """The proxy is cut after the first step: steps go on, an eval runs, checkpoints are staged
    (not in the bucket), the last one too, and the run waits for its upload. The proxy is restored:
    that checkpoint, made during the outage, is committed and the run ends with exit code 0."""
    max_steps, every = 100, 20
    run_uri = storage.join(s3_root, "runs", "outage")
    staging = staging_dir(tmp_path / "cache", run_uri)
    committed = CommittedStore(storage.join(run_uri, "checkpoints"))  # the server itself, not the proxy
    with TcpProxy(s3_server.port) as proxy:
        env = env_for(tmp_path / "cache", s3_env_through(proxy, s3_server.env()) | FAST_FAIL)
        res = voxrelay("prepare", CONFIG, *tiny(s3_root), env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        trainer = Trainer(s3_root, env, "name=outage", f"train.max_steps={max_steps}", "train.eval_every=50",
                          f"checkpoint.every_steps={every}", "train.log_every=5")
        try:
            assert trainer.first_step.wait(120), trainer.output()
            proxy.cut()
            at_cut = _last_step(trainer)
            # a checkpoint of the outage staged on local disk while training goes on
            _wait_until(lambda: [s for s in staged_steps(staging) if at_cut < s < max_steps], trainer,
                        "staged checkpoint during the outage")
            _wait_until(lambda: _last_step(trainer) >= at_cut + 2 * every, trainer, "steps during the outage")
            # the last one is staged before the final wait for its upload
            _wait_until(lambda: max_steps in staged_steps(staging), trainer, f"staged step {max_steps}")
            assert committed.list() == [], trainer.output()  # nothing made it through the cut proxy
            proxy.restore()
            assert trainer.proc.wait(timeout=300) == 0, trainer.output()
        finally:
            trainer.kill()  # (a no-op when it ended)
    out = trainer.output()
    assert "upload of step" in out and "failed" in out  # the outage was noticed and reported
    manifest = storage.read_json(storage.join(run_uri, "checkpoints", f"step-{max_steps:08d}", MANIFEST))
    assert manifest["step"] == max_steps  # made during the outage, committed after it
    assert staged_steps(staging) == []  # nothing is left to upload
    step, weights = final_weights(run_uri, tmp_path / "fetch")
    assert step == max_steps and weights


def test_sigterm_saves_uploads_and_exits_with_code(tmp_path, gcs_root):
    env = _env(tmp_path, fast_fail=False)
    res = voxrelay("prepare", CONFIG, *tiny(gcs_root), env=env)
    assert res.returncode == 0, res.stderr
    trainer = Trainer(gcs_root, env, "name=term", "train.max_steps=100000", NO_SAVES,
                      NO_EVALS, "train.log_every=1")
    assert trainer.wait_step_lines(3, 120), trainer.output()  # mid-run, a few steps in
    trainer.proc.send_signal(signal.SIGTERM)
    assert trainer.proc.wait(timeout=120) == EXIT_PREEMPTED, trainer.output()
    out = trainer.output()
    assert "SIGTERM received" in out and "checkpoint committed" in out
    step, _ = final_weights(storage.join(gcs_root, "runs", "term"), tmp_path / "fetch")
    assert step == _last_step(trainer) and step > 0
    # and the next session resumes from it
    res = voxrelay("train", CONFIG, *tiny(gcs_root, "name=term", f"train.max_steps={step + 2}",
                                          NO_SAVES, NO_EVALS), env=env)
    assert res.returncode == 0 and f"resuming {storage.join(gcs_root, 'runs', 'term')} from step {step}" in res.stderr


def test_second_sigint_aborts_at_once_and_leaves_no_broken_checkpoint(tmp_path):
    from voxrelay.checkpoint.stops import EXIT_ABORTED

    root = str(tmp_path / "root")
    env = _env(tmp_path, fast_fail=False)
    assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
    # a bigger model, so that the emergency save and upload take a moment to interrupt
    trainer = Trainer(root, env, "train.max_steps=100000", "checkpoint.every_steps=3", NO_EVALS,
                      "train.log_every=1", "model.hidden_size=256", "model.num_layers=4", "model.intermediate_size=768")
    assert trainer.first_step.wait(120), trainer.output()
    ckpts = tmp_path / "root/runs/demo/checkpoints"
    _wait_until(lambda: list(ckpts.glob("*/manifest.json")), trainer, "committed checkpoint", 60)
    trainer.proc.send_signal(signal.SIGINT)
    _wait_until(lambda: "SIGINT received" in trainer.output(), trainer, "'SIGINT received'", 30)
    trainer.proc.send_signal(signal.SIGINT)
    assert trainer.proc.wait(timeout=60) == EXIT_ABORTED, trainer.output()
    assert "second SIGINT" in trainer.output()
    committed = CommittedStore(storage.join(root, "runs", "demo", "checkpoints")).list()
    assert committed, trainer.output()
    for ckpt in committed:  # every committed checkpoint is whole: each file as its manifest says
        for name, meta in ckpt.manifest["files"].items():
            path = Path(ckpt.uri) / name
            assert (path.stat().st_size, sha256_file(path)) == (meta["size"], meta["sha256"]), path
