"""A bucket's settings that decide what it costs (for ``voxrelay doctor``): location, replication, versioning,
soft delete, storage classes and lifecycle rules, read with the SDK the storage layer already uses.

* gs://: one ``GET b/<bucket>`` of the JSON API (gcsfs), the bucket resource
  (https://cloud.google.com/storage/docs/json_api/v1/buckets): ``location``, ``locationType``,
  ``customPlacementConfig.dataLocations``, ``storageClass``, ``autoclass``, ``versioning``, ``softDeletePolicy``,
  ``lifecycle.rule``. Needs ``storage.buckets.get`` (not in roles/storage.objectAdmin).
* s3://: GetBucketLocation, GetBucketVersioning, GetBucketLifecycleConfiguration, GetBucketReplication (s3fs's
  botocore client) and the storage class of the first objects listed under the root (S3 has no default class).

A setting the server does not report (an emulator, a denied request) is None: the doctor says it could not tell.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from voxrelay.storage.core import _fs, _split, retry
from voxrelay.storage.counters import CLASS_A, CLASS_B, count

OBJECTS_SAMPLED = 1000  # s3: objects listed under the root for their storage classes (one listing)


@dataclass(frozen=True)
class LifecycleRule:
    """One action of a lifecycle rule, provider-neutral.

    ``kind``: ``delete`` (live objects), ``transition`` (to ``storage_class``), ``noncurrent`` (deletes old
    versions / soft-deleted data), ``abort_uploads`` (incomplete multipart uploads) or ``other``; ``days``: its
    age condition in days (None: none); ``prefixes``: the keys it applies to (empty: the whole bucket)."""

    kind: str
    days: int | None = None
    storage_class: str | None = None
    prefixes: tuple[str, ...] = ()


@dataclass
class BucketInfo:
    """What a bucket's metadata says; None where the server did not say (see the module docstring)."""

    provider: str  # "gcs" | "s3"
    bucket: str
    location: str | None = None  # GCS: "US-CENTRAL1", "US", "NAM4"; S3: "us-east-1"
    location_type: str | None = None  # "region" | "dual-region" | "multi-region"
    data_locations: list[str] = field(default_factory=list)  # a configurable dual-region's regions
    storage_class: str | None = None  # GCS: the bucket's default class
    autoclass: bool = False  # GCS Autoclass: classes managed, no early-deletion charges
    object_classes: dict[str, int] = field(default_factory=dict)  # S3: class -> objects among those sampled
    versioning: bool | None = None
    soft_delete_s: int | None = None  # GCS: retention of deleted objects, seconds (0: off)
    lifecycle: list[LifecycleRule] | None = None
    replication: list[str] | None = None  # S3: the destinations of replication rules
    endpoint: str | None = None  # a non-default endpoint (emulator, S3-compatible service)


def bucket_info(uri: str) -> BucketInfo | None:
    """The settings of the bucket of a gs:// or s3:// ``uri``; None for a local or memory root.

    Raises :class:`~voxrelay.storage.StorageError` (denied, missing bucket, no network) like every storage call."""
    proto, path = _split(uri)
    bucket, _, key = path.partition("/")
    if proto == "gcs":
        count(CLASS_B)
        fs = _fs("gcs")
        raw = retry(lambda: fs.call("GET", "b/{}", bucket, json_out=True), f"read the settings of gs://{bucket}")
        info = gcs_bucket_info(raw)
        info.endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or None
        return info
    if proto == "s3":
        return _s3_bucket_info(bucket, key)
    return None


def gcs_bucket_info(raw: dict[str, Any]) -> BucketInfo:
    """A GCS bucket resource (JSON API) -> :class:`BucketInfo`."""
    soft = raw.get("softDeletePolicy")
    placement = raw.get("customPlacementConfig") or {}
    return BucketInfo(
        provider="gcs", bucket=raw.get("name", ""), location=raw.get("location"),
        location_type=raw.get("locationType"),
        data_locations=[str(r).lower() for r in placement.get("dataLocations") or []],
        storage_class=raw.get("storageClass"), autoclass=bool((raw.get("autoclass") or {}).get("enabled")),
        # the JSON API omits what was never set: no `versioning` is off, no `lifecycle` no rules; but
        # `softDeletePolicy` is always there (retention "0" when off): without it the server does not say
        versioning=bool((raw.get("versioning") or {}).get("enabled")),
        soft_delete_s=int(soft.get("retentionDurationSeconds") or 0) if isinstance(soft, dict) else None,
        lifecycle=[_gcs_rule(r) for r in (raw.get("lifecycle") or {}).get("rule") or []],
    )


def _gcs_rule(rule: dict[str, Any]) -> LifecycleRule:
    action, cond = rule.get("action") or {}, rule.get("condition") or {}
    kind = {"Delete": "delete", "SetStorageClass": "transition",
            "AbortIncompleteMultipartUpload": "abort_uploads"}.get(action.get("type"), "other")
    noncurrent = cond.get("isLive") is False or any(
        k in cond for k in ("numNewerVersions", "daysSinceNoncurrentTime", "noncurrentTimeBefore"))
    if kind == "delete" and noncurrent:
        kind = "noncurrent"
    days = cond.get("age", cond.get("daysSinceNoncurrentTime", cond.get("daysSinceCustomTime")))
    return LifecycleRule(kind, None if days is None else int(days), action.get("storageClass"),
                         tuple(cond.get("matchesPrefix") or ()))


def _s3_code(err: BaseException) -> str | None:
    """The S3 error code (``NoSuchLifecycleConfiguration``) behind an s3fs error, if any."""
    response = getattr(err.__cause__, "response", None) or getattr(err, "response", None)
    return (response.get("Error") or {}).get("Code") if isinstance(response, dict) else None


def _s3_call(fs: Any, method: str, absent: tuple[str, ...], **kw: Any) -> dict[str, Any] | None:
    """One S3 call through s3fs; None when S3 answers that the setting is not configured (a code in ``absent``)."""
    def call() -> dict[str, Any] | None:
        try:
            return fs.call_s3(method, **kw)
        except OSError as err:
            if _s3_code(err) in absent:
                return None
            raise

    return retry(call, f"{method} s3://{kw.get('Bucket')}")


def _s3_bucket_info(bucket: str, key: str) -> BucketInfo:
    fs = _fs("s3")
    count(CLASS_B)
    where = _s3_call(fs, "get_bucket_location", (), Bucket=bucket) or {}
    # None (and the legacy "EU") are what GetBucketLocation answers for us-east-1 (and eu-west-1)
    region = {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}.get(where.get("LocationConstraint"),
                                                                         where.get("LocationConstraint"))
    count(CLASS_B)
    versioning = _s3_call(fs, "get_bucket_versioning", (), Bucket=bucket) or {}
    count(CLASS_B)
    lifecycle = _s3_call(fs, "get_bucket_lifecycle_configuration", ("NoSuchLifecycleConfiguration",), Bucket=bucket)
    count(CLASS_B)
    replication = _s3_call(fs, "get_bucket_replication", ("ReplicationConfigurationNotFoundError",), Bucket=bucket)
    count(CLASS_A)
    listed = _s3_call(fs, "list_objects_v2", (), Bucket=bucket, Prefix=key.rstrip("/") + "/" if key else "",
                      MaxKeys=OBJECTS_SAMPLED) or {}
    classes: dict[str, int] = {}
    for obj in listed.get("Contents") or []:
        name = obj.get("StorageClass") or "STANDARD"
        classes[name] = classes.get(name, 0) + 1
    rules = (replication or {}).get("ReplicationConfiguration", {}).get("Rules") or []
    return BucketInfo(
        provider="s3", bucket=bucket, location=region, location_type="region", object_classes=classes,
        versioning=versioning.get("Status") == "Enabled",  # Suspended keeps the versions made so far, new ones not
        lifecycle=[r for rule in (lifecycle or {}).get("Rules") or [] if rule.get("Status") == "Enabled"
                   for r in s3_rules(rule)],
        replication=[r.get("Destination", {}).get("Bucket", "?") for r in rules if r.get("Status") == "Enabled"],
        endpoint=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None,
    )


def s3_rules(rule: dict[str, Any]) -> list[LifecycleRule]:
    """One S3 lifecycle rule (GetBucketLifecycleConfiguration's shape) -> its actions."""
    filt = rule.get("Filter") or {}
    prefix = filt.get("Prefix", (filt.get("And") or {}).get("Prefix", rule.get("Prefix")))
    prefixes = (prefix,) if prefix else ()
    out: list[LifecycleRule] = []
    if (exp := rule.get("Expiration")) and "Days" in exp:
        out.append(LifecycleRule("delete", int(exp["Days"]), None, prefixes))
    out += [LifecycleRule("transition", int(t.get("Days", 0)), t.get("StorageClass"), prefixes)
            for t in rule.get("Transitions") or []]
    if (nc := rule.get("NoncurrentVersionExpiration")) is not None:
        out.append(LifecycleRule("noncurrent", nc.get("NoncurrentDays"), None, prefixes))
    if (ab := rule.get("AbortIncompleteMultipartUpload")) is not None:
        out.append(LifecycleRule("abort_uploads", ab.get("DaysAfterInitiation"), None, prefixes))
    return out
