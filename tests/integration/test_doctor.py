"""``voxrelay doctor`` end to end: a local root, an S3 root (moto), a GCS root (fake-gcs-server) and a gcsfuse-
mounted root (a recorded mount table and bucket resource), with a loopback metadata server saying where the
machine is; the verdicts, the exit code (1 when a check fails), and no probe object left behind."""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest
from typer.testing import CliRunner

from tests.helpers.metadata import MetadataServer, RecordedGCS
from tests.helpers.servers import apply_env, reset_storage_cache
from voxrelay import storage
from voxrelay.cli import app, demo_config_path
from voxrelay.config import load_config
from voxrelay.doctor import FAIL, OK, SKIP, WARN
from voxrelay.doctor.diagnose import diagnose
from voxrelay.errors import UserError

runner = CliRunner()
PROBE = "--probe-mb=2"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VOXRELAY_CACHE", str(tmp_path / "cache"))


def doctor(root: str, metadata_url: str, *more: str) -> tuple[int, dict[str, dict]]:
    """Exit code and the checks by name of `voxrelay doctor --json` on the demo config at ``root``."""
    args = ["doctor", str(demo_config_path()), f"root={root}", f"checkpoint.metadata_url={metadata_url}",
            "cache.min_free_gb=0", PROBE, "--json", *more]
    res = runner.invoke(app, args, catch_exceptions=False)
    checks = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    return res.exit_code, {c["name"]: c for c in checks}


def test_local_root_off_cloud(tmp_path):
    root = tmp_path / "root"
    with MetadataServer() as md:  # answers neither GCE nor AWS
        code, checks = doctor(str(root), md.url)
    assert code == 0
    assert checks["bucket"]["verdict"] == SKIP
    assert checks["throughput"]["verdict"] in (OK, WARN) and "2 MB probe, deleted" in checks["throughput"]["found"]
    assert checks["mounted root"]["verdict"] == OK
    assert checks["local disk"]["verdict"] in (OK, WARN)  # cache.min_free_gb=0: it cannot fail
    assert {"HF cache", "GPU memory"} <= set(checks)
    assert [p for p in root.rglob("*") if p.is_file()] == []


def test_s3_root_in_the_machines_region_passes_elsewhere_fails(s3_root):
    with MetadataServer(aws_region="us-east-1") as md:
        code, checks = doctor(s3_root, md.url)
    assert code == 0, checks
    assert [checks[n]["verdict"] for n in ("region", "replication", "versioning", "storage class", "lifecycle")] \
        == [OK] * 5
    assert checks["soft delete"]["verdict"] == SKIP
    assert storage.listdir(s3_root) == []  # the probe object is gone
    with MetadataServer(aws_region="ap-southeast-1") as md:
        code, checks = doctor(s3_root, md.url, "--probe-mb=0")
    assert code == 1
    assert checks["region"]["verdict"] == FAIL and "ap-southeast-1" in checks["region"]["fix"]


def test_gcs_root_passes_and_a_versioned_bucket_fails(gcs_server, gcs_root):
    with MetadataServer(gce_zone="us-central1-a") as md:
        code, checks = doctor(gcs_root, md.url)
        assert code == 0, checks
        assert checks["region"]["verdict"] == OK and "us-central1-a" in checks["region"]["found"]
        assert checks["soft delete"]["verdict"] == SKIP  # fake-gcs-server has no soft-delete policy
        assert storage.listdir(gcs_root) == []
        name = f"doctor-{uuid.uuid4().hex[:12]}"
        req = urllib.request.Request(f"{gcs_server.endpoint}/storage/v1/b?project=voxrelay", method="POST",
                                     data=json.dumps({"name": name, "versioning": {"enabled": True}}).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()
        code, checks = doctor(f"gs://{name}/run", md.url)
    assert code == 1
    assert checks["versioning"]["verdict"] == FAIL and "--no-versioning" in checks["versioning"]["fix"]
    assert storage.listdir(f"gs://{name}/run") == []


def test_table_output_and_summary(tmp_path):
    with MetadataServer() as md:
        res = runner.invoke(app, ["doctor", str(demo_config_path()), f"root={tmp_path / 'r'}", "--probe-mb=0",
                                  f"checkpoint.metadata_url={md.url}", "cache.min_free_gb=0"])
    assert res.exit_code == 0
    assert "voxrelay doctor" in res.stdout and "mounted root" in res.stdout
    assert "0 failed" in res.stdout


def test_gcsfuse_root_is_recognised_and_its_bucket_checked(tmp_path, monkeypatch):
    mounted = tmp_path / "gcs"
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda1 / ext4 rw 0 0\ntts-colab-data {mounted} fuse.gcsfuse rw,nosuid,nodev 0 0\n")
    with RecordedGCS("gcs_bucket_multi_region") as gcs, MetadataServer(gce_zone="us-central1-b") as md:
        apply_env({"STORAGE_EMULATOR_HOST": gcs.url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}, monkeypatch)
        try:
            cfg = load_config(None, [f"root={mounted / 'voxrelay'}", f"checkpoint.metadata_url={md.url}"])
            checks = {c.name: c for c in diagnose(cfg, probe_mb=1, mounts_file=str(mounts), gpu=None)}
        finally:
            reset_storage_cache()
    assert checks["mounted root"].verdict == WARN
    assert checks["mounted root"].fix.startswith("set root=gs://tts-colab-data/voxrelay ")
    assert checks["replication"].verdict == FAIL and checks["region"].verdict == OK
    assert checks["soft delete"].verdict == WARN and checks["versioning"].verdict == FAIL
    assert checks["throughput"].verdict in (OK, WARN)  # measured on the folder itself
    assert checks["GPU memory"].verdict == SKIP


def test_bad_config_is_a_user_error(tmp_path):
    """The CLI's entry point turns a UserError into exit 2 with its message and no traceback."""
    res = runner.invoke(app, ["doctor", str(tmp_path / "missing.yaml")])
    assert isinstance(res.exception, UserError) and "No such file or directory" in str(res.exception)
    res = runner.invoke(app, ["doctor", str(demo_config_path()), "cache.min_free_gb=-1"])
    assert isinstance(res.exception, UserError) and "cache.min_free_gb" in str(res.exception)
