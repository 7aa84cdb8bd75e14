"""The bucket checks of ``voxrelay doctor`` as pure functions: each passing and failing, on values; the recorded
GCS bucket resources (tests/fixtures/doctor) parsed as the JSON API returns them."""

from __future__ import annotations

import json

import pytest

from tests.helpers.metadata import FIXTURES
from voxrelay.config import load_config
from voxrelay.doctor import EXIT_FAILED, FAIL, OK, SKIP, WARN, Check, exit_code
from voxrelay.doctor.checks import (
    bucket_checks,
    covers,
    lifecycle_check,
    location_check,
    replication_check,
    soft_delete_check,
    storage_class_check,
    versioning_check,
)
from voxrelay.doctor.cloud import Machine
from voxrelay.storage.bucket import BucketInfo, LifecycleRule, gcs_bucket_info, s3_rules

IOWA = Machine("gcp", "us-central1", "us-central1-a")
NETHERLANDS = Machine("gcp", "europe-west4", "europe-west4-b")
VIRGINIA = Machine("aws", "us-east-1")


def gcs(**kw) -> BucketInfo:
    return BucketInfo(**{"provider": "gcs", "bucket": "b", "location": "US-CENTRAL1", "location_type": "region",
                         "storage_class": "STANDARD", "versioning": False, "soft_delete_s": 0, "lifecycle": [], **kw})


def s3(**kw) -> BucketInfo:
    return BucketInfo(**{"provider": "s3", "bucket": "b", "location": "us-east-1", "location_type": "region",
                         "versioning": False, "lifecycle": [], "replication": [], **kw})


def recorded(name: str) -> BucketInfo:
    return gcs_bucket_info(json.loads((FIXTURES / f"{name}.json").read_text()))


# -- region

def test_location_same_region_passes_and_another_region_fails_naming_the_fix():
    assert location_check(gcs(), IOWA).verdict == OK
    far = location_check(gcs(), NETHERLANDS)
    assert far.verdict == FAIL
    assert "US-CENTRAL1" in far.found and "europe-west4" in far.found
    assert "--location=europe-west4" in far.fix and "Colab" in far.fix
    assert "cost.cross_region=true" in location_check(gcs(), NETHERLANDS, priced=False).fix
    assert "cost.cross_region" not in location_check(gcs(), NETHERLANDS, priced=True).fix
    assert location_check(s3(), VIRGINIA).verdict == OK
    aws_far = location_check(s3(location="eu-west-1"), VIRGINIA)
    assert aws_far.verdict == FAIL and "aws s3 mb s3://NEW --region us-east-1" in aws_far.fix
    assert "Colab" not in aws_far.fix


def test_location_inside_a_multi_or_dual_region_passes():
    assert covers(gcs(location="US", location_type="multi-region"), "us-central1")
    assert not covers(gcs(location="US", location_type="multi-region"), "northamerica-northeast1")
    assert covers(gcs(location="EU", location_type="multi-region"), "europe-west4")
    assert not covers(gcs(location="EU", location_type="multi-region"), "europe-west2")  # London: not in the EU
    assert covers(gcs(location="NAM4", location_type="dual-region"), "us-east1")
    assert not covers(gcs(location="NAM4", location_type="dual-region"), "us-west1")
    configurable = gcs(location="US", location_type="dual-region", data_locations=["us-east1", "us-west1"])
    assert location_check(configurable, Machine("gcp", "us-west1", "us-west1-b")).verdict == OK
    assert location_check(configurable, IOWA).verdict == FAIL  # in "US", but not one of its two regions


def test_location_across_clouds_fails_and_off_cloud_skips():
    cross = location_check(gcs(), VIRGINIA)
    assert cross.verdict == FAIL and "aws s3 mb" in cross.fix
    off = location_check(gcs(), None)
    assert off.verdict == SKIP and "metadata server" in off.found
    assert location_check(gcs(location=None), IOWA).verdict == SKIP


# -- replication

def test_replication_regional_passes_multi_and_dual_region_fail():
    assert replication_check(gcs()).verdict == OK
    multi = replication_check(gcs(location="US", location_type="multi-region"), "us-central1")
    assert multi.verdict == FAIL and "--location=us-central1" in multi.fix and "cost.multi_region=true" in multi.fix
    dual = replication_check(gcs(location="NAM4", location_type="dual-region"), priced=True)
    assert dual.verdict == FAIL and "--location=us-central1" in dual.fix  # the pair's first region
    assert "cost.multi_region" not in dual.fix  # already priced
    assert replication_check(gcs(location_type=None)).verdict == SKIP


def test_s3_replication_rules_warn():
    assert replication_check(s3()).verdict == OK
    replicated = replication_check(s3(replication=["arn:aws:s3:::backup"]))
    assert replicated.verdict == WARN and "arn:aws:s3:::backup" in replicated.found
    assert replication_check(s3(replication=None)).verdict == SKIP


# -- soft delete

def test_soft_delete_off_passes_on_warns_with_the_gcloud_fix():
    assert soft_delete_check(gcs(soft_delete_s=0)).verdict == OK
    assert "cost.soft_delete_days=0" in soft_delete_check(gcs(soft_delete_s=0), priced_days=7.0).fix
    week = soft_delete_check(gcs(soft_delete_s=7 * 86400))
    assert week.verdict == WARN and "7 days" in week.found
    assert "--clear-soft-delete" in week.fix and "cost.soft_delete_days=7" in week.fix
    assert "cost.soft_delete_days" not in soft_delete_check(gcs(soft_delete_s=7 * 86400), priced_days=7.0).fix
    assert soft_delete_check(gcs(soft_delete_s=None)).verdict == SKIP  # an emulator says nothing
    assert soft_delete_check(s3()).verdict == SKIP


# -- versioning

def test_versioning_off_passes_on_without_cleanup_fails():
    assert versioning_check(gcs(versioning=False)).verdict == OK
    kept = versioning_check(gcs(versioning=True), "runs")
    assert kept.verdict == FAIL and "--no-versioning" in kept.fix
    s3_kept = versioning_check(s3(versioning=True))
    assert s3_kept.verdict == FAIL and "Status=Suspended" in s3_kept.fix
    assert versioning_check(gcs(versioning=None)).verdict == SKIP


def test_versioning_with_a_noncurrent_rule_passes_unless_the_rule_is_for_other_keys():
    cleaned = gcs(versioning=True, lifecycle=[LifecycleRule("noncurrent", 7)])
    check = versioning_check(cleaned, "runs")
    assert check.verdict == OK and "after 7 days" in check.found
    elsewhere = gcs(versioning=True, lifecycle=[LifecycleRule("noncurrent", 7, prefixes=("logs/",))])
    assert versioning_check(elsewhere, "runs").verdict == FAIL


# -- storage class

def test_storage_class_standard_passes_minimum_duration_classes_fail():
    assert storage_class_check(gcs()).verdict == OK
    nearline = storage_class_check(gcs(storage_class="NEARLINE"))
    assert nearline.verdict == FAIL and "30 days" in nearline.found
    assert "--default-storage-class=STANDARD" in nearline.fix
    assert storage_class_check(gcs(storage_class="ARCHIVE")).found.count("365") == 1
    assert storage_class_check(gcs(storage_class="NEARLINE", autoclass=True)).verdict == OK


def test_s3_object_classes_with_minimum_durations_fail():
    assert storage_class_check(s3(object_classes={"STANDARD": 12})).verdict == OK
    assert storage_class_check(s3()).verdict == OK  # nothing written yet
    ia = storage_class_check(s3(object_classes={"STANDARD": 3, "STANDARD_IA": 9}))
    assert ia.verdict == FAIL and "9 STANDARD_IA (30 days minimum)" in ia.found and "of 12 objects" in ia.found
    assert "restored" in storage_class_check(s3(object_classes={"GLACIER": 1})).found


# -- lifecycle

def test_lifecycle_benign_rules_pass_deletes_and_cold_transitions_warn():
    benign = [LifecycleRule("abort_uploads", 7), LifecycleRule("noncurrent", 3),
              LifecycleRule("delete", 3, prefixes=("scratch/",)), LifecycleRule("transition", 30, "STANDARD")]
    assert lifecycle_check(gcs(lifecycle=benign), "runs/tts").verdict == OK
    deletes = lifecycle_check(gcs(lifecycle=[LifecycleRule("delete", 30)]), "runs/tts")
    assert deletes.verdict == WARN and "after 30 days" in deletes.found and "--clear-lifecycle" in deletes.fix
    cold = lifecycle_check(s3(lifecycle=[LifecycleRule("transition", 30, "STANDARD_IA", ("runs/",))]), "runs/tts")
    assert cold.verdict == WARN and "STANDARD_IA" in cold.found and "delete-bucket-lifecycle" in cold.fix
    inside = lifecycle_check(gcs(lifecycle=[LifecycleRule("delete", 1, prefixes=("runs/tts/tmp/",))]), "runs/tts")
    assert inside.verdict == WARN  # a rule for keys inside the root reaches the run's objects
    assert lifecycle_check(gcs(lifecycle=None)).verdict == SKIP


def test_s3_lifecycle_rules_become_actions():
    rule = {"ID": "all", "Status": "Enabled", "Filter": {"And": {"Prefix": "runs/", "Tags": []}},
            "Expiration": {"Days": 90}, "Transitions": [{"Days": 30, "StorageClass": "GLACIER_IR"}],
            "NoncurrentVersionExpiration": {"NoncurrentDays": 5},
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 2}}
    assert s3_rules(rule) == [LifecycleRule("delete", 90, None, ("runs/",)),
                              LifecycleRule("transition", 30, "GLACIER_IR", ("runs/",)),
                              LifecycleRule("noncurrent", 5, None, ("runs/",)),
                              LifecycleRule("abort_uploads", 2, None, ("runs/",))]
    assert s3_rules({"Prefix": "", "Status": "Enabled", "Expiration": {"ExpiredObjectDeleteMarker": True}}) == []


# -- recorded bucket resources (the JSON API's shape)

def test_recorded_multi_region_bucket_fails_replication_and_versioning():
    b = recorded("gcs_bucket_multi_region")
    assert (b.location, b.location_type, b.versioning, b.soft_delete_s) == ("US", "multi-region", True, 604800)
    verdicts = {c.name: c.verdict for c in bucket_checks(b, IOWA, "run", load_config(None, []).cost)}
    assert verdicts == {"region": OK, "replication": FAIL, "soft delete": WARN, "versioning": FAIL,
                        "storage class": OK, "lifecycle": OK}


def test_recorded_regional_bucket_passes_every_check():
    b = recorded("gcs_bucket_regional")
    assert b.versioning is False and b.soft_delete_s == 0  # `versioning` absent: never enabled
    assert [r.kind for r in b.lifecycle] == ["abort_uploads", "delete"]
    checks = bucket_checks(b, IOWA, "voxrelay/runs")
    assert {c.verdict for c in checks} == {OK}, checks
    assert exit_code(checks) == 0


def test_recorded_dual_region_nearline_bucket():
    b = recorded("gcs_bucket_dual_region_nearline")
    verdicts = {c.name: c.verdict for c in bucket_checks(b, IOWA, "run")}
    assert verdicts == {"region": OK, "replication": FAIL, "soft delete": WARN, "versioning": OK,
                        "storage class": FAIL, "lifecycle": WARN}
    assert "90 days" in soft_delete_check(b).found


def test_recorded_configurable_dual_region_with_autoclass():
    b = recorded("gcs_bucket_configurable_dual_autoclass")
    assert b.data_locations == ["us-east1", "us-west1"] and b.autoclass
    checks = {c.name: c for c in bucket_checks(b, Machine("gcp", "us-east1", "us-east1-c"), "run")}
    assert checks["region"].verdict == OK and checks["versioning"].verdict == OK
    assert checks["storage class"].verdict == OK and checks["replication"].verdict == FAIL


def test_local_root_has_one_bucket_row_and_exit_code_follows_failures():
    (row,) = bucket_checks(None, IOWA)
    assert row.verdict == SKIP
    assert exit_code([Check("a", OK, ""), Check("b", WARN, ""), Check("c", SKIP, "")]) == 0
    assert exit_code([Check("a", OK, ""), Check("b", FAIL, "")]) == EXIT_FAILED


@pytest.mark.parametrize("location,region,inside", [("ASIA", "asia-east1", True), ("ASIA", "us-east1", False),
                                                    ("EUR4", "europe-north1", True), ("ASIA1", "asia-east1", False)])
def test_covers_table(location, region, inside):
    kind = "multi-region" if location == "ASIA" else "dual-region"
    assert covers(gcs(location=location, location_type=kind), region) is inside
