"""The machine checks of ``voxrelay doctor``: throughput to the root, a root on a mounted folder, free local
disk, where the Hugging Face cache points, the GPU vs the memory plan. Pure functions of measured values."""

from __future__ import annotations

from pathlib import Path

from voxrelay import storage
from voxrelay.checkpoint.lease import FUSE_LEASE_CAVEAT, fuse_root_fix
from voxrelay.doctor import FAIL, OK, SKIP, WARN, Check
from voxrelay.doctor.facts import Gpu, Probe
from voxrelay.storage.mounts import Mount, gcsfuse_uri, mount_kind

GB = 10**9
MIN_READ_MBPS = 50.0  # below this a data loader feeding a GPU from the bucket may wait on reads
MIN_WRITE_MBPS = 20.0  # below this a multi-GB checkpoint takes minutes to upload (a preemption gives 30 s)
HF_MIN_FREE_GB = 20.0  # a hub cache needs room for a few models (Orpheus-3B alone is 6.6 GB)
GPU_HEADROOM = 0.9  # a plan above this share of the card's memory leaves little for fragmentation

_ROOT_FIX = "set root=gs://BUCKET/path (or s3://): voxrelay then writes objects atomically, in parallel, with " \
    "nothing cached on the local disk"
CAVEATS = {
    "gcsfuse": "renames are copies + deletes (not atomic), each listing is a bucket listing (slow, billed), "
               "written files upload only on close, other machines may see stale data",
    "Google Drive": "Drive syncs later (files written just before the runtime ends may never arrive), caches "
                    "writes on the local disk (it fills), has upload quotas (750 GB a day) and slow listings",
    "FUSE": "renames may not be atomic, fsync may not reach the remote store, listings are slow",
}


def lease_check(root: str, ignored: str | None, error: str | None = None, mount: Mount | None = None,
                single_machine: bool = False) -> Check:
    """What a run's lease (one writer per run) rests on: the root's conditional create, probed (create one object
    twice, expect a refusal), and a local root's mount (a FUSE ``mount`` needs ``checkpoint.single_machine``)."""
    name = "lease"
    if mount is not None and not single_machine:
        return Check(name, FAIL, f"{root} is on a {mount_kind(mount)} mount: `voxrelay train` refuses it "
                     f"({FUSE_LEASE_CAVEAT})", fuse_root_fix(root, mount))
    if error is not None:
        return Check(name, FAIL, f"the conditional-create probe failed: {error}", "fix access to the root first")
    if ignored is not None:
        return Check(name, FAIL, f"{root}: {ignored}; `voxrelay train` refuses it (two sessions would both win "
                     "a run's lease)", "use GCS, AWS S3 or a store honouring If-None-Match/If-Match, or a local folder")
    if mount is not None:
        return Check(name, WARN, f"{root} is on a {mount_kind(mount)} mount, trained with "
                     f"checkpoint.single_machine: {FUSE_LEASE_CAVEAT}", "")
    return Check(name, OK, "a second create of one object is refused: one writer per run holds")


def mounted_root_check(root: str, mount: Mount | None) -> Check:
    """A local ``root`` inside a FUSE mount (gcsfuse, Colab's Google Drive) works, with caveats."""
    name = "mounted root"
    if not storage.is_local(root):
        return Check(name, OK, f"{root}: the bucket directly, no mount")
    kind = mount_kind(mount)
    if kind is None:
        on = f" ({mount.fstype} at {mount.point})" if mount else ""
        return Check(name, OK, f"{root}: a local folder{on}")
    assert mount is not None
    fix = _ROOT_FIX
    if (uri := gcsfuse_uri(root, mount)) is not None:
        fix = f"set root={uri} (the bucket itself): voxrelay then writes objects atomically, in parallel, with " \
            "nothing cached on the local disk"
    return Check(name, WARN, f"{root} is on a {kind} mount ({mount.point}, {mount.fstype}): {CAVEATS[kind]}; "
                 "one writer per run: see the lease row", fix)


def throughput_check(probe: Probe | None, error: str | None = None, checkpoint_bytes: int | None = None,
                     min_read: float = MIN_READ_MBPS, min_write: float = MIN_WRITE_MBPS) -> Check:
    """The probe's MB/s (10^6 bytes) both ways against ``min_read`` / ``min_write``."""
    name = "throughput"
    if error is not None:
        return Check(name, FAIL, f"the probe could not be written and read back: {error}",
                     "fix access to the root first (the message says what); then run doctor again")
    if probe is None:
        return Check(name, SKIP, "not measured (--probe-mb 0)")
    found = (f"write {probe.write_mbps:.0f} MB/s, read {probe.read_mbps:.0f} MB/s "
             f"({probe.size / 1e6:.0f} MB probe, deleted)")
    if checkpoint_bytes:
        seconds = checkpoint_bytes / 1e6 / probe.write_mbps
        found += f"; a {checkpoint_bytes / GB:.1f} GB checkpoint uploads in ~{seconds:.0f} s (one stream)"
    slow = [f"read under {min_read:g} MB/s"] * (probe.read_mbps < min_read)
    slow += [f"write under {min_write:g} MB/s"] * (probe.write_mbps < min_write)
    if not slow:
        return Check(name, OK, found)
    return Check(name, WARN, f"{found}: {' and '.join(slow)}",
                 "run in the bucket's region (see `region`) and root on the bucket, not a mount; slow reads "
                 "starve the GPU (raise cache.prefetch_shards), slow writes lengthen every upload (one interrupted "
                 "by a preemption loses the checkpoint)")


def disk_check(path: str, free: int, min_free_gb: float, cache_max_gb: float, checkpoint_bytes: int | None = None,
               max_staged: int = 1, mount: Mount | None = None) -> Check:
    """Free bytes on the disk of the local cache (``path``: shard cache, staged checkpoints) vs what a run keeps
    there: ``cache.min_free_gb`` left free, ``cache.max_gb`` of shards, ``max_staged`` checkpoints of
    ``checkpoint_bytes`` (when the plan could tell)."""
    name = "local disk"
    fix = (f"free space on the disk of {path}, or point VOXRELAY_CACHE at a bigger local disk; or lower "
           "cache.max_gb / checkpoint.max_staged")
    ckpt = checkpoint_bytes or 0
    found = f"{free / GB:.1f} GB free at {path}"
    if mount_kind(mount) is not None:
        return Check(name, WARN, f"{found}, on a {mount_kind(mount)} mount: the cache is not local",
                     "point VOXRELAY_CACHE at a local disk (e.g. /tmp or /content on Colab)")
    if free < min_free_gb * GB + ckpt:
        what = f"cache.min_free_gb={min_free_gb:g}" + (f" + one {ckpt / GB:.1f} GB checkpoint" if ckpt else "")
        return Check(name, FAIL, f"{found}, under {what}: shards are not cached (read from the bucket every "
                     "epoch) and a checkpoint may not stage", fix)
    want = (min_free_gb + cache_max_gb) * GB + ckpt * max_staged
    if free < want:
        staged = f" + {max_staged} staged checkpoints of {ckpt / GB:.1f} GB" if ckpt else ""
        return Check(name, WARN, f"{found}, under cache.max_gb={cache_max_gb:g} + cache.min_free_gb="
                     f"{min_free_gb:g}{staged}: the shard cache stays smaller (more reads from the bucket)", fix)
    sized = f"; a checkpoint is ~{ckpt / GB:.1f} GB" if ckpt else ""
    return Check(name, OK, f"{found} (cache.max_gb={cache_max_gb:g}, cache.min_free_gb={min_free_gb:g}{sized})")


def hf_cache_check(path: Path, source: str, free: int, mount: Mount | None) -> Check:
    """Where pretrained models land: a FUSE mount is slow (and Drive fills the local disk anyway); a disk with
    little room (a VM's small root disk) fills with a few models."""
    name = "HF cache"
    found = f"{path} ({source}), {free / GB:.1f} GB free"
    fix = ("unset HF_HOME and HF_HUB_CACHE: voxrelay keeps the hub cache at $VOXRELAY_CACHE/hf-hub and copies models "
           "to and from cache.models_uri in the bucket")
    if mount_kind(mount) is not None:
        return Check(name, WARN, f"{found}, on a {mount_kind(mount)} mount ({mount.point}): every model load reads "
                     "through the mount", fix)
    if free < HF_MIN_FREE_GB * GB:
        where = f" (on {mount.point})" if mount else ""
        return Check(name, WARN, f"{found}{where}: a few models fill it", "point HF_HUB_CACHE (or VOXRELAY_CACHE) "
                     "at a disk with more room, e.g. a local SSD or /content on Colab")
    return Check(name, OK, found)


def gpu_check(gpu: Gpu | None, strategy: str | None = None, need: int | None = None, advice: str = "",
              error: str | None = None) -> Check:
    """The GPU's memory vs the plan's bytes per GPU (``need``) for the config's ``strategy`` on this machine's
    GPUs. ``advice``: the plan's next-best strategy as overrides, for the fix."""
    name = "GPU memory"
    if gpu is None:
        return Check(name, SKIP, "no CUDA GPU on this machine",
                     "`voxrelay plan CONFIG --gpu a100-40gb` predicts the memory for a GPU you would rent")
    card = f"{gpu.count} x {gpu.name} ({gpu.memory / GB:.1f} GB)"
    if error is not None or need is None:
        return Check(name, SKIP, f"{card}; no memory plan: {error or 'not computed'}")
    found = f"{card}; the plan predicts {need / GB:.1f} GB per GPU for {strategy}"
    if need > gpu.memory:
        return Check(name, FAIL, f"{found}: it does not fit (train stops before loading weights)",
                     advice or "lower train.batch_tokens (`voxrelay plan` lists every strategy)")
    if need > GPU_HEADROOM * gpu.memory:
        return Check(name, WARN, f"{found}: under {100 * (1 - GPU_HEADROOM):.0f}% left for fragmentation",
                     advice or "lower train.batch_tokens a little (`voxrelay plan` lists every strategy)")
    return Check(name, OK, found)
