"""``voxrelay doctor``: gather the facts (bucket settings, the machine's region, a throughput probe, mounts,
disks, the GPU and its memory plan), run every check, print the table (or JSON)."""

from __future__ import annotations

import json
from dataclasses import asdict

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from voxrelay import storage
from voxrelay.config import RunConfig
from voxrelay.cost.config import CostConfig
from voxrelay.doctor import FAIL, OK, SKIP, WARN, Check
from voxrelay.doctor.checks import bucket_checks
from voxrelay.doctor.cloud import Machine, machine_location
from voxrelay.doctor.facts import (
    Gpu,
    disk_free,
    gpu_info,
    hf_cache,
    probe,
)
from voxrelay.doctor.host_checks import (
    disk_check,
    gpu_check,
    hf_cache_check,
    lease_check,
    mounted_root_check,
    throughput_check,
)
from voxrelay.errors import UserError, one_line
from voxrelay.paths import cache_dir
from voxrelay.storage.bucket import bucket_info
from voxrelay.storage.mounts import Mount, gcsfuse_uri, mount_kind, mount_of, read_mounts

DEFAULT_PROBE_MB = 32.0
_COLOURS = {OK: "green", WARN: "yellow", FAIL: "red", SKIP: "dim"}


def diagnose(cfg: RunConfig, probe_mb: float = DEFAULT_PROBE_MB, mounts_file: str | None = None,
             gpu: Gpu | None | str = "detect") -> list[Check]:
    """Every check for ``cfg``'s root on this machine. ``mounts_file``: the mount table to read (a recorded one
    in tests); ``gpu``: "detect" (torch, when an NVIDIA device exists) or the GPU to plan for (None: none)."""
    machine = machine_location(cfg.checkpoint.metadata_url)
    mounts = read_mounts(mounts_file)
    root_mount = mount_of(storage.local_path(cfg.root), mounts) if storage.is_local(cfg.root) else None
    # a gcsfuse mount's bucket is checked as a gs:// root would be
    checks = bucket_part(gcsfuse_uri(cfg.root, root_mount) or cfg.root, machine, cfg.cost)
    gpu = gpu_info() if gpu == "detect" else gpu
    gpu_row, checkpoint_bytes = gpu_part(cfg, gpu)
    checks.append(probe_part(cfg.root, probe_mb, checkpoint_bytes))
    checks.append(mounted_root_check(cfg.root, root_mount))
    fuse = root_mount if mount_kind(root_mount) is not None else None
    checks.append(lease_part(cfg.root, fuse, cfg.checkpoint.single_machine))
    cache = cache_dir()
    checks.append(disk_check(str(cache), disk_free(cache)[0], cfg.cache.min_free_gb, cfg.cache.max_gb,
                             checkpoint_bytes, cfg.checkpoint.max_staged, mount_of(cache, mounts)))
    hub, source = hf_cache()
    if hub == cache_dir("hf-hub"):
        source = "voxrelay's own: $VOXRELAY_CACHE/hf-hub"
    checks.append(hf_cache_check(hub, source, disk_free(hub)[0], mount_of(hub, mounts)))
    return [*checks, gpu_row]


def _key(root: str) -> str:
    """The root's path inside its bucket."""
    return root.split("://", 1)[1].partition("/")[2].strip("/")


def bucket_part(root: str, machine: Machine | None, cost: CostConfig | None = None) -> list[Check]:
    """The bucket checks of ``root``; one ``bucket`` row instead when it has no bucket or its settings cannot be
    read. ``cost``: the run's cost section (the fixes name its keys)."""
    if storage.is_local(root) or root.startswith("memory://"):
        return bucket_checks(None, machine)
    try:
        info = bucket_info(root)
    except FileNotFoundError:
        scheme, _, rest = root.partition("://")
        return [Check("bucket", FAIL, f"{scheme}://{rest.split('/', 1)[0]} does not exist (or is not visible to "
                      "these credentials)", "create it in the GPUs' region, or fix `root`")]
    except storage.StorageDenied as err:
        return [Check("bucket", WARN, f"its settings cannot be read: {one_line(err)}",
                      "grant storage.buckets.get (gs://: roles/storage.legacyBucketReader; s3://: s3:GetBucket*, "
                      "s3:GetLifecycleConfiguration, s3:GetReplicationConfiguration) to check them")]
    except storage.StorageError as err:
        return [Check("bucket", FAIL, f"its settings could not be read: {one_line(err)}", "")]
    return bucket_checks(info, machine, _key(root), cost)


def lease_part(root: str, mount: Mount | None, single_machine: bool) -> Check:
    """``mount``: the FUSE mount a local root lies on (None: a bucket or a local disk)."""
    try:
        return lease_check(root, storage.ignores_conditional_create(root), mount=mount, single_machine=single_machine)
    except (storage.StorageError, OSError) as err:
        return lease_check(root, None, error=one_line(err), mount=mount, single_machine=single_machine)


def probe_part(root: str, probe_mb: float, checkpoint_bytes: int | None) -> Check:
    if probe_mb <= 0:
        return throughput_check(None)
    try:
        return throughput_check(probe(root, int(probe_mb * 1e6)), checkpoint_bytes=checkpoint_bytes)
    except (storage.StorageError, OSError) as err:
        return throughput_check(None, error=one_line(err))


def gpu_part(cfg: RunConfig, gpu: Gpu | None) -> tuple[Check, int | None]:
    """The GPU row, and a checkpoint's bytes (trainable weights + optimizer states) when the plan was made.
    The plan reads the prepared data's lengths, or takes ``train.batch_tokens`` before there is any."""
    if gpu is None:
        return gpu_check(None), None
    from voxrelay.plan import PlanError, configured, make_plan
    from voxrelay.plan.fit import next_best, overrides
    from voxrelay.plan.formulas import grad_bytes, optimizer_bytes
    from voxrelay.plan.host import this_machine
    from voxrelay.plan.model import lengths, model_facts, read_index

    try:
        index = read_index(cfg)
        if index is None and cfg.train.batch_tokens is None:
            raise PlanError("no prepared data yet and train.batch_seconds set: run `voxrelay prepare` first")
        facts, model = model_facts(cfg, index)
        plan = make_plan(cfg, facts, lengths(cfg, model, index, None if index else cfg.train.batch_tokens),
                         gpu.count, gpu.memory, host_memory=this_machine())  # advice the host can hold too
    except (UserError, OSError) as err:
        return gpu_check(gpu, error=one_line(err)), None
    mine = configured(cfg, gpu.count)
    row = next(r for r in plan.rows if r.strategy == mine)
    best = next_best(plan, mine)
    advice = f"try {overrides(best.strategy, cfg)} (`voxrelay plan` shows every strategy)" if best else ""
    params = facts.params[mine.lora]
    checkpoint = grad_bytes(params) + optimizer_bytes(params, mine.optimizer)
    return gpu_check(gpu, mine.name, row.per_gpu_bytes["total"], advice), checkpoint


def summary(checks: list[Check]) -> str:
    counts = {v: sum(c.verdict == v for c in checks) for v in (FAIL, WARN, OK, SKIP)}
    warnings = f"{counts[WARN]} warning" + "s" * (counts[WARN] != 1)
    return f"{counts[FAIL]} failed, {warnings}, {counts[OK]} ok, {counts[SKIP]} skipped"


def print_checks(checks: list[Check], console: Console) -> None:
    """The table (a row per check, the fix beside what was found), then the counts."""
    table = Table(show_lines=True, title="voxrelay doctor")
    table.add_column("check", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("found", ratio=3)
    table.add_column("fix", ratio=2)
    for c in checks:
        colour = _COLOURS[c.verdict]
        table.add_row(c.name, f"[{colour}]{c.verdict}[/]", escape(c.found), escape(c.fix))
    console.print(table)
    console.print(summary(checks), highlight=False)


def to_json(checks: list[Check]) -> str:
    """One JSON object per line per check: name, verdict, found, fix."""
    return "\n".join(json.dumps(asdict(c)) for c in checks)

