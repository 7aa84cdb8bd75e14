"""A bucket that refuses writes (HTTP 403: billing disabled, access revoked, a retention lock) is fatal at
once, naming the bucket and the fix, whatever exception class the SDK raises for it (gcsfs raises a plain
OSError("Forbidden"), which used to be retried as transient while the run trained on with nothing durable):
refused from the start, `train` exits 2 before writing anything; refused mid-run, training stops with its
checkpoint staged (exit 74: final, a new machine would be refused too, so no job template recovers
on it) instead of retrying for ever."""

from __future__ import annotations

import os

import pytest

from tests.helpers.gate import WriteGate
from tests.helpers.runner import CONFIG, Trainer, env_for, voxrelay
from tests.helpers.tiny import NO_EVALS, tiny
from voxrelay.checkpoint.stops import EXIT_FAILED_FOR_GOOD

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py


def _env(tmp_path, kind: str, gate: WriteGate) -> dict:
    env = env_for(tmp_path / "cache") | {k: v for k, v in os.environ.items()
                                          if k.startswith(("AWS_", "STORAGE_EMULATOR", "GCSFS_"))}
    if kind == "gcs":
        return env | {"STORAGE_EMULATOR_HOST": gate.endpoint}
    return env | {"AWS_ENDPOINT_URL": gate.endpoint, "AWS_ENDPOINT_URL_S3": gate.endpoint}


@pytest.mark.parametrize("kind", ["gcs", "s3"])
def test_a_bucket_that_refuses_writes_stops_training_at_once(tmp_path, kind, request):
    server = request.getfixturevalue(f"{kind}_server")
    root = request.getfixturevalue(f"{kind}_root")
    bucket = f"{'gs' if kind == 'gcs' else 's3'}://{server.bucket}"
    with WriteGate(server.port, kind) as gate:
        env = _env(tmp_path, kind, gate)
        assert voxrelay("prepare", CONFIG, *tiny(root), env=env).returncode == 0
        trainer = Trainer(root, env, "name=denied", "train.max_steps=100000", NO_EVALS,
                          "train.log_every=1", "checkpoint.every_steps=2")
        try:
            assert trainer.wait_step_lines(3, 120), trainer.output()
            gate.refuse()  # billing disabled while it trains
            code = trainer.proc.wait(timeout=180)  # it used to retry for ever
        finally:
            trainer.kill()
        out = " ".join(trainer.output().split())
        assert code == EXIT_FAILED_FOR_GOOD, trainer.output()
        assert gate.refused and f"access to {bucket} was denied" in out and "check the credentials" in out, out
        assert "only on this machine" in out  # where its last checkpoint is
        again = voxrelay("train", CONFIG, *tiny(root, "name=other", "train.max_steps=2"), env=env)
        msg = " ".join(again.stderr.split())
        assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr
        assert f"access to {bucket} was denied" in msg and "check the credentials" in msg, msg
