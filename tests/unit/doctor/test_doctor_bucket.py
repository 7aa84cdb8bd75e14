"""Bucket settings read through the storage SDKs (s3fs, gcsfs) from the test servers: moto (location, versioning,
lifecycle, replication, object storage classes), fake-gcs-server (location, versioning), and the recorded GCS
bucket resources for what fake-gcs-server does not model (soft delete, multi-region, lifecycle, storage class)."""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest

from tests.helpers.metadata import RecordedGCS
from tests.helpers.servers import apply_env, reset_storage_cache
from voxrelay.doctor import FAIL, OK, SKIP, WARN
from voxrelay.doctor.checks import bucket_checks
from voxrelay.doctor.cloud import Machine
from voxrelay.doctor.diagnose import bucket_part
from voxrelay.storage.bucket import LifecycleRule, bucket_info

IOWA = Machine("gcp", "us-central1", "us-central1-a")
VIRGINIA = Machine("aws", "us-east-1")


def _verdicts(checks) -> dict[str, str]:
    return {c.name: c.verdict for c in checks}


@pytest.fixture
def s3_client(s3_server, s3_root):
    import boto3

    return boto3.client("s3", endpoint_url=s3_server.endpoint, region_name="us-east-1")


def test_s3_default_bucket_passes(s3_root):
    info = bucket_info(s3_root)
    assert (info.location, info.versioning, info.lifecycle, info.replication) == ("us-east-1", False, [], [])
    assert _verdicts(bucket_checks(info, VIRGINIA, "run")) == {
        "region": OK, "replication": OK, "soft delete": SKIP, "versioning": OK, "storage class": OK, "lifecycle": OK}
    (missing,) = bucket_part("s3://no-such-bucket-doctor/run", VIRGINIA)
    assert missing.verdict == FAIL and "s3://no-such-bucket-doctor does not exist" in missing.found


def test_s3_bucket_with_every_trap_fails(s3_root, s3_client):
    name = f"doctor-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    s3_client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    s3_client.put_bucket_lifecycle_configuration(Bucket=name, LifecycleConfiguration={"Rules": [
        {"ID": "cold", "Status": "Enabled", "Filter": {"Prefix": "run/"},
         "Transitions": [{"Days": 30, "StorageClass": "STANDARD_IA"}], "Expiration": {"Days": 60}}]})
    s3_client.put_bucket_replication(Bucket=name, ReplicationConfiguration={
        "Role": "arn:aws:iam::123456789012:role/replication", "Rules": [
            {"ID": "all", "Status": "Enabled", "Priority": 1, "Filter": {"Prefix": ""},
             "DeleteMarkerReplication": {"Status": "Disabled"},
             "Destination": {"Bucket": "arn:aws:s3:::tts-backup"}}]})
    s3_client.put_object(Bucket=name, Key="run/a", Body=b"1", StorageClass="STANDARD_IA")
    s3_client.put_object(Bucket=name, Key="run/b", Body=b"2")
    s3_client.put_object(Bucket=name, Key="other/c", Body=b"3", StorageClass="GLACIER")  # outside the root

    info = bucket_info(f"s3://{name}/run")
    assert info.location == "eu-west-1" and info.versioning is True
    assert info.object_classes == {"STANDARD_IA": 1, "STANDARD": 1}
    assert LifecycleRule("transition", 30, "STANDARD_IA", ("run/",)) in info.lifecycle
    assert info.replication == ["arn:aws:s3:::tts-backup"]
    assert _verdicts(bucket_checks(info, VIRGINIA, "run")) == {
        "region": FAIL, "replication": WARN, "soft delete": SKIP, "versioning": FAIL, "storage class": FAIL,
        "lifecycle": WARN}


def test_gcs_emulator_bucket_passes_and_a_versioned_one_fails(gcs_server, gcs_root):
    info = bucket_info(gcs_root)
    assert (info.location, info.location_type, info.versioning, info.soft_delete_s) == \
        ("US-CENTRAL1", "region", False, None)
    verdicts = _verdicts(bucket_checks(info, IOWA, "run"))
    assert verdicts == {"region": OK, "replication": OK, "soft delete": SKIP, "versioning": OK,
                        "storage class": OK, "lifecycle": OK}
    assert _verdicts(bucket_checks(info, Machine("gcp", "asia-east1", "asia-east1-b")))["region"] == FAIL

    name = f"doctor-{uuid.uuid4().hex[:12]}"
    req = urllib.request.Request(f"{gcs_server.endpoint}/storage/v1/b?project=voxrelay", method="POST",
                                 data=json.dumps({"name": name, "versioning": {"enabled": True}}).encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()
    assert _verdicts(bucket_checks(bucket_info(f"gs://{name}/run"), IOWA, "run"))["versioning"] == FAIL


@pytest.fixture
def recorded_gcs(monkeypatch):
    """The recorded bucket resources served as the JSON API, with gcsfs pointed at them."""
    with RecordedGCS("gcs_bucket_multi_region", "gcs_bucket_regional") as gcs:
        apply_env({"STORAGE_EMULATOR_HOST": gcs.url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}, monkeypatch)
        yield gcs
    reset_storage_cache()  # no filesystem of a later test may talk to the stopped server


def test_recorded_gcs_responses_through_gcsfs(recorded_gcs):
    multi = bucket_info("gs://tts-colab-data/voxrelay")
    assert (multi.location_type, multi.soft_delete_s, multi.versioning) == ("multi-region", 604800, True)
    assert _verdicts(bucket_checks(multi, IOWA, "voxrelay")) == {
        "region": OK, "replication": FAIL, "soft delete": WARN, "versioning": FAIL, "storage class": OK,
        "lifecycle": OK}
    regional = bucket_part("gs://tts-train-usc1/voxrelay", IOWA)
    assert {c.verdict for c in regional} == {OK}, regional
    (missing,) = bucket_part("gs://no-such-bucket/voxrelay", IOWA)
    assert missing.name == "bucket" and missing.verdict == FAIL and "does not exist" in missing.found
    assert ("GET", "/storage/v1/b/tts-colab-data") in recorded_gcs.requests
