"""The bucket checks of ``voxrelay doctor``: pure functions of a :class:`~voxrelay.storage.bucket.BucketInfo`
(what the bucket's metadata says) and the machine's location; each returns a :class:`~voxrelay.doctor.Check`.

Prices named in messages are list prices of 2025 (https://cloud.google.com/storage/pricing,
https://aws.amazon.com/s3/pricing/); the minimum storage durations are the providers' documented ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from voxrelay.doctor import FAIL, OK, SKIP, WARN, Check
from voxrelay.doctor.cloud import Machine
from voxrelay.storage.bucket import BucketInfo, LifecycleRule

if TYPE_CHECKING:
    from voxrelay.cost.config import CostConfig

# GCS multi-regions by the prefix of the regions they span (EU: member states only, not London or Zurich)
MULTI_REGIONS = {"us": ("us-",), "eu": ("europe-",), "asia": ("asia-",)}
NOT_IN_EU = ("europe-west2", "europe-west6")
# GCS predefined dual-regions and their two regions
DUAL_REGIONS = {"asia1": ("asia-northeast1", "asia-northeast2"), "eur4": ("europe-north1", "europe-west4"),
                "eur5": ("europe-west1", "europe-west2"), "eur7": ("europe-west2", "europe-west3"),
                "eur8": ("europe-west3", "europe-west6"), "nam4": ("us-central1", "us-east1")}
# days an object of the class is billed for at least, even when deleted sooner (early-deletion charge)
MIN_DAYS = {"NEARLINE": 30, "COLDLINE": 90, "ARCHIVE": 365,  # GCS
            "STANDARD_IA": 30, "ONEZONE_IA": 30, "GLACIER_IR": 90, "GLACIER": 90, "DEEP_ARCHIVE": 180}  # S3
NEEDS_RESTORE = ("GLACIER", "DEEP_ARCHIVE")  # S3: unreadable until restored


def _uri(b: BucketInfo) -> str:
    return f"{'gs' if b.provider == 'gcs' else 's3'}://{b.bucket}"


def regions_of(b: BucketInfo) -> tuple[str, ...] | None:
    """The regions a bucket's data is in (a multi-region: the prefixes of its regions); None if unknown."""
    if not b.location:
        return None
    loc = b.location.lower()
    if b.data_locations:
        return tuple(b.data_locations)
    return DUAL_REGIONS.get(loc) or MULTI_REGIONS.get(loc) or (loc,)


def covers(b: BucketInfo, region: str) -> bool:
    """Whether the bucket keeps its data in ``region`` (one of its regions, or inside its multi-region)."""
    regions = regions_of(b) or ()
    if b.location and b.location.lower() in MULTI_REGIONS and not b.data_locations:
        return region.startswith(regions) and not (b.location.lower() == "eu" and region in NOT_IN_EU)
    return region in regions


def _new_bucket(b: BucketInfo, region: str, provider: str | None = None) -> str:
    """How to make a bucket in ``region`` (of ``provider``, default the bucket's) and move the data there."""
    provider = provider or b.provider
    scheme = "gs" if provider == "gcs" else "s3"
    make = (f"gcloud storage buckets create gs://NEW --location={region} --soft-delete-duration=0"
            if provider == "gcs" else f"aws s3 mb s3://NEW --region {region}")
    copy = (f"gcloud storage cp -r {_uri(b)}/* gs://NEW/" if provider == b.provider == "gcs" else
            f"aws s3 sync {_uri(b)} s3://NEW" if provider == b.provider else f"rclone copy {_uri(b)} {scheme}://NEW")
    return f"`{make}`, copy the data (`{copy}`) and set root={scheme}://NEW/..."


def location_check(b: BucketInfo, machine: Machine | None, priced: bool | None = None) -> Check:
    """The bucket's region vs the machine's: reads and writes between regions are slower and billed per GB.
    ``priced``: ``cost.cross_region`` (so the fix can say to set it while the bucket stays)."""
    name = "region"
    if machine is None:
        return Check(name, SKIP, f"{_uri(b)} is in {b.location or '?'}; this machine is not on GCE/Colab or EC2 "
                     "(no metadata server answered)", "run where the bucket is (a machine outside the cloud pays "
                     "internet egress, ~$0.12/GB, on every byte it reads)")
    if not b.location:
        return Check(name, SKIP, f"{_uri(b)}: its location is not reported (needs storage.buckets.get)")
    here = f"this machine in {machine.region}" + (f" (zone {machine.zone})" if machine.zone else "")
    where = f"{_uri(b)} in {b.location}" + (f" ({b.location_type})" if b.location_type else "")
    if (machine.cloud == "gcp") != (b.provider == "gcs"):
        return Check(name, FAIL, f"{where}, {here} on {machine.cloud.upper()}: every byte crosses clouds, billed as "
                     "internet egress (~$0.09-0.12/GB)", "use a bucket of the machine's cloud: "
                     + _new_bucket(b, machine.region, "gcs" if machine.cloud == "gcp" else "s3"))
    if covers(b, machine.region):
        return Check(name, OK, f"{where}, {here}")
    fix = _new_bucket(b, machine.region)
    if machine.cloud == "gcp":
        fix += " (a Colab runtime cannot choose its region: keep the bucket where most runtimes land)"
    if priced is False:
        fix += "; meanwhile set cost.cross_region=true so `voxrelay status --cost` prices the traffic"
    return Check(name, FAIL, f"{where}, {here}: every byte read or written crosses regions, slower and billed "
                 "per GB (~$0.02/GB between regions of a continent, up to $0.15/GB between continents)", fix)


def replication_check(b: BucketInfo, region: str | None = None, priced: bool | None = None) -> Check:
    """Multi- and dual-region buckets (GCS) and replication rules (S3) bill every byte written a second time.
    ``region``: the machine's (where the new bucket should be); ``priced``: ``cost.multi_region`` (so the fix
    can say to set it while the bucket stays)."""
    name = "replication"
    if b.provider == "s3":
        if b.replication is None:
            return Check(name, SKIP, f"{_uri(b)}: replication rules not reported")
        if b.replication:
            return Check(name, WARN, f"{_uri(b)} replicates to {', '.join(b.replication)}: every byte written "
                         "(each checkpoint) is copied and billed again (transfer + storage)",
                         "remove the replication rule for the run's prefix (`aws s3api delete-bucket-replication`)")
        return Check(name, OK, f"{_uri(b)}: one region, no replication rules")
    kind = (b.location_type or "").lower()
    if not kind:
        return Check(name, SKIP, f"{_uri(b)}: its location type is not reported")
    if kind in ("multi-region", "dual-region"):
        cost = "" if priced else "; meanwhile set cost.multi_region=true so `voxrelay status --cost` prices it"
        pair = DUAL_REGIONS.get((b.location or "").lower(), ())
        target = region or (pair + tuple(b.data_locations) + ("REGION",))[0]
        return Check(name, FAIL, f"{_uri(b)} is {kind} {b.location}: every byte written (each checkpoint, "
                     "~$0.02/GB in North America) is replicated to another region and billed as replication",
                     f"move to a regional bucket where the GPUs run: {_new_bucket(b, target)}{cost}")
    return Check(name, OK, f"{_uri(b)} is {kind} {b.location}: no replication charges")


def soft_delete_check(b: BucketInfo, priced_days: float | None = None) -> Check:
    """GCS keeps deleted and overwritten objects for the soft-delete retention, billed as stored."""
    name = "soft delete"
    if b.provider != "gcs":
        return Check(name, SKIP, f"{_uri(b)}: S3 has no soft delete (versioning is its counterpart)")
    if b.soft_delete_s is None:
        return Check(name, SKIP, f"{_uri(b)}: the soft-delete policy is not reported (an emulator?)")
    days = b.soft_delete_s / 86400
    if days == 0:
        fix = "" if not priced_days else f"set cost.soft_delete_days=0 (it is {priced_days:g}: `voxrelay status " \
            "--cost` prices deleted checkpoints this bucket no longer bills)"
        return Check(name, OK, f"{_uri(b)}: off (a deleted checkpoint stops being billed at once)", fix)
    cost = "" if priced_days == days else f"; meanwhile set cost.soft_delete_days={days:g} to have it priced"
    return Check(name, WARN, f"{_uri(b)}: {days:g} days: each checkpoint the run rotates out (checkpoint.keep_last) "
                 f"and each overwritten file stays billed {days:g} days after it is deleted",
                 f"`gcloud storage buckets update {_uri(b)} --clear-soft-delete`{cost}")


def _applies(rule: LifecycleRule, key: str) -> bool:
    """Whether a rule reaches objects under the root's ``key`` (no prefix: the whole bucket)."""
    key = key.strip("/")
    return not rule.prefixes or any(key.startswith(p.rstrip("/")) or p.startswith(key) for p in rule.prefixes)


def versioning_check(b: BucketInfo, key: str = "") -> Check:
    """Versioning keeps every deleted or overwritten object as a noncurrent version, billed until it is deleted."""
    name = "versioning"
    if b.versioning is None:
        return Check(name, SKIP, f"{_uri(b)}: versioning not reported")
    if not b.versioning:
        return Check(name, OK, f"{_uri(b)}: off")
    cleanup = [r for r in b.lifecycle or [] if r.kind == "noncurrent" and _applies(r, key)]
    if cleanup:
        days = [r.days for r in cleanup if r.days is not None]
        after = f"after {min(days)} days" if days else "by count"
        return Check(name, OK, f"{_uri(b)}: on; a lifecycle rule deletes noncurrent versions {after}")
    off = (f"`gcloud storage buckets update {_uri(b)} --no-versioning`" if b.provider == "gcs" else
           f"`aws s3api put-bucket-versioning --bucket {b.bucket} --versioning-configuration Status=Suspended`")
    return Check(name, FAIL, f"{_uri(b)}: on, and no lifecycle rule deletes noncurrent versions: every checkpoint "
                 "the run rotates out stays stored (and billed) as an old version, forever",
                 f"turn it off ({off}) or add a lifecycle rule that deletes noncurrent versions after a few days; "
                 "then delete the old versions already kept")


def storage_class_check(b: BucketInfo) -> Check:
    """Classes with a minimum storage duration bill a checkpoint deleted after an hour for 30-365 days."""
    name = "storage class"
    if b.autoclass:
        return Check(name, OK, f"{_uri(b)}: Autoclass (no early-deletion or retrieval charges)")
    if b.provider == "gcs":
        if not b.storage_class:
            return Check(name, SKIP, f"{_uri(b)}: the default storage class is not reported")
        if b.storage_class in MIN_DAYS:
            return Check(name, FAIL, f"{_uri(b)}: default class {b.storage_class}: each object is billed for "
                         f"{MIN_DAYS[b.storage_class]} days at least (a rotated checkpoint too) and every read pays a "
                         "retrieval fee per GB", f"`gcloud storage buckets update {_uri(b)} "
                         "--default-storage-class=STANDARD` (new objects), and rewrite the existing ones")
        return Check(name, OK, f"{_uri(b)}: default class {b.storage_class} (no minimum duration)")
    slow = {c: n for c, n in b.object_classes.items() if c in MIN_DAYS}
    sampled = sum(b.object_classes.values())
    if not slow:
        classes = ", ".join(sorted(b.object_classes)) or "none yet; new ones are STANDARD"
        return Check(name, OK, f"{_uri(b)}: objects under the root: {classes} ({sampled} listed)")
    listed = ", ".join(f"{n} {c} ({MIN_DAYS[c]} days minimum)" for c, n in sorted(slow.items()))
    restore = "; GLACIER / DEEP_ARCHIVE objects cannot be read until restored" if set(slow) & set(NEEDS_RESTORE) \
        else ""
    return Check(name, FAIL, f"{_uri(b)}: of {sampled} objects under the root, {listed}: deleting them sooner is "
                 f"billed as if kept, and reads pay retrieval fees{restore}",
                 "copy them back to STANDARD (`aws s3 cp --recursive --storage-class STANDARD` onto themselves) and "
                 "remove the lifecycle transition that moved them")


def lifecycle_check(b: BucketInfo, key: str = "") -> Check:
    """Rules that delete the run's objects (its prepared data, the checkpoints it resumes from) or move them to a
    class with a minimum duration; rules for old versions and unfinished uploads are fine."""
    name = "lifecycle"
    if b.lifecycle is None:
        return Check(name, SKIP, f"{_uri(b)}: lifecycle rules not reported (an emulator?)")
    mine = [r for r in b.lifecycle if _applies(r, key)]
    deletes = [r for r in mine if r.kind == "delete"]
    moves = [r for r in mine if r.kind == "transition" and (r.storage_class or "") in MIN_DAYS]
    if not deletes and not moves:
        kept = ", ".join(sorted({r.kind for r in mine})) or "none"
        return Check(name, OK, f"{_uri(b)}: no rule deletes or moves the root's objects (rules for it: {kept})")
    said = [f"deletes objects after {r.days} days (a longer run loses its prepared data; an older checkpoint "
            "is gone)" for r in deletes]
    said += [f"moves objects to {r.storage_class} after {r.days} days (billed {MIN_DAYS[r.storage_class]} days at "
             "least, a retrieval fee per GB read)" for r in moves]
    where = " or ".join(sorted({p for r in deletes + moves for p in r.prefixes})) or "the whole bucket"
    clear = (f"`gcloud storage buckets update {_uri(b)} --clear-lifecycle`" if b.provider == "gcs"
             else f"`aws s3api delete-bucket-lifecycle --bucket {b.bucket}`")
    return Check(name, WARN, f"{_uri(b)}: a rule for {where} {'; '.join(said)}", "limit the rule to other "
                 f"prefixes, or remove it ({clear}) and set the rules you need again")


def bucket_checks(b: BucketInfo | None, machine: Machine | None, key: str = "",
                  cost: CostConfig | None = None) -> list[Check]:
    """Every bucket check, in the order the table shows them. ``key``: the root's path inside the bucket;
    ``cost``: the run's ``cost`` section, if any (the fixes then say which of its keys to set). A local root
    (no bucket) gets one ``bucket`` row that says so."""
    if b is None:
        return [Check("bucket", SKIP, "a local root: no bucket settings to check (region, replication, soft "
                      "delete, versioning, storage class and lifecycle are checked for gs:// and s3:// roots)")]
    return [location_check(b, machine, None if cost is None else cost.cross_region),
            replication_check(b, machine.region if machine else None, None if cost is None else cost.multi_region),
            soft_delete_check(b, None if cost is None else cost.soft_delete_days),
            versioning_check(b, key), storage_class_check(b), lifecycle_check(b, key)]
