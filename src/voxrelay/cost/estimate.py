"""The cost estimate of a run, from its usage and its checkpoints: pure arithmetic (the formulas below are
those docs/durability.md gives; GiB = 2^30 bytes, a month = 730 hours, as GCS and S3 bill).

So far (each item's price from the ``cost`` section):

* gpu: process-seconds (each session's time from its process's start to its last record, times its
  processes) / 3600 x ``gpu_hour``;
* operations: class A / 10^4 x ``class_a_per_10k`` + class B / 10^4 x ``class_b_per_10k``;
* egress (``cross_region``): GiB read + written x ``egress_gb``;
* replication (``multi_region``): GiB written x ``replication_gb``;
* soft delete: GiB written but no longer kept (deleted checkpoints, overwritten metrics) x
  ``storage_gb_month`` x ``soft_delete_days`` / (730 / 24);
* stored: GiB of the checkpoints kept now x ``storage_gb_month`` x months from the run's first session's
  start to its last record (now while a session trains).

The first four are what training spends as it goes: ``cost.budget`` counts them (:func:`training_spend`).
The last two are rent, billed by the calendar whether training goes on or not: shown, not budgeted.

To finish: the GPU-hours of the steps left at the measured steps per second (else at the run's average
so far) x the newest session's processes; operations, egress, replication and written bytes scale with
the steps left (so far x left / done); stored: the checkpoints kept at the end (keep_last, + every
keep_every-th, + the best) for the time left and ``keep_months`` after.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from voxrelay.cost.config import CostConfig

GIB = 2**30
HOURS_PER_MONTH = 730.0
DAYS_PER_MONTH = HOURS_PER_MONTH / 24
CHECKPOINT_SHARE = 0.25  # checkpoints cost at least this share of the total: advice on saving less often
ITEM_SHARE = 0.10  # a single avoidable item (soft delete, replication, egress) at least this share: advice


@dataclass
class Usage:
    """What a run used over all its sessions (summed from ``<run>/usage.json``)."""

    process_seconds: float = 0.0  # sum over sessions of seconds x processes
    class_a: int = 0
    class_b: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    processes: int = 1  # of the newest session
    sessions: int = 0


@dataclass
class RunFacts:
    """What the estimate needs of a run besides its usage (``status`` reads it from the run folder)."""

    step: int
    max_steps: int
    finished: bool
    steps_per_sec: float | None  # measured (the newest throughput reports), None when unknown
    kept: int  # committed checkpoints in the bucket now
    kept_bytes: int
    checkpoint_bytes: int  # the newest checkpoint's
    age_s: float  # since the run's first session started
    keep_last: int = 2
    keep_every: int | None = None
    keep_best: bool = False
    every_steps: int | None = None
    every_minutes: float | None = None


@dataclass
class Line:
    item: str
    so_far: float | None  # USD; None: not priced
    to_finish: float | None  # USD; None: not priced or unknown
    how: str


@dataclass
class CostReport:
    lines: list[Line]
    spent: float  # USD training has spent: what cost.budget counts
    budget: float | None
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def line(self, item: str) -> Line:
        return next(line for line in self.lines if line.item == item)

    @property
    def so_far(self) -> float:
        return sum(line.so_far or 0.0 for line in self.lines)

    @property
    def to_finish(self) -> float:
        return sum(line.to_finish or 0.0 for line in self.lines)


def training_spend(u: Usage, cost: CostConfig) -> dict[str, float]:
    """USD per item that training has spent (what ``cost.budget`` counts); an unpriced GPU counts 0."""
    return {
        "gpu": u.process_seconds / 3600 * (cost.gpu_hour or 0.0),
        "operations": u.class_a / 1e4 * cost.class_a_per_10k + u.class_b / 1e4 * cost.class_b_per_10k,
        "egress": (u.bytes_read + u.bytes_written) / GIB * cost.egress_gb if cost.cross_region else 0.0,
        "replication": u.bytes_written / GIB * cost.replication_gb if cost.multi_region else 0.0,
    }


def cost_report(u: Usage, cost: CostConfig, f: RunFacts) -> CostReport:
    """Each item so far and to finish, what training spent, and advice when checkpoints dominate."""
    left = 0 if f.finished else max(0, f.max_steps - f.step)
    ratio = left / f.step if f.step else (0.0 if left == 0 else None)  # steps left per step done
    spend = training_spend(u, cost)
    hours = u.process_seconds / 3600
    if left and f.steps_per_sec:
        hours_left = left / f.steps_per_sec * u.processes / 3600
    else:
        hours_left = None if ratio is None else hours * ratio
    gpu = cost.gpu_hour
    lines = [Line("gpu", None if gpu is None else spend["gpu"],
                  None if gpu is None or hours_left is None else hours_left * gpu,
                  f"{_n(hours)} GPU-h ({u.processes} process{'es' if u.processes > 1 else ''})"
                  + (" (not priced: set cost.gpu_hour, USD per GPU-hour)" if gpu is None else f" x ${gpu:g}/h")
                  + ("" if hours_left is None or not left else f"; {_n(hours_left)} h to finish"))]
    lines.append(Line("operations", spend["operations"], _scaled(spend["operations"], ratio),
                      f"{u.class_a} class A x ${cost.class_a_per_10k:g}/10k + {u.class_b} class B x "
                      f"${cost.class_b_per_10k:g}/10k"))
    moved = (u.bytes_read + u.bytes_written) / GIB
    lines.append(Line("egress", spend["egress"], _scaled(spend["egress"], ratio),
                      f"{_n(moved)} GiB read + written x ${cost.egress_gb:g}/GiB" if cost.cross_region else
                      "none: cost.cross_region is false (the bucket is in the machine's region)"))
    lines.append(Line("replication", spend["replication"], _scaled(spend["replication"], ratio),
                      f"{_n(u.bytes_written / GIB)} GiB written x ${cost.replication_gb:g}/GiB" if cost.multi_region
                      else "none: cost.multi_region is false (a regional bucket)"))
    lines += _storage_lines(u, cost, f, ratio, hours_left)
    report = CostReport(lines, sum(spend.values()), cost.budget)
    report.advice = advice(report, cost, f, u.class_a / 1e4 * cost.class_a_per_10k * (1 + (ratio or 0.0)))
    if gpu is None:
        report.notes.append("the GPU is not priced: set cost.gpu_hour (USD per GPU-hour) for the whole bill and "
                            "to see whether checkpoints dominate it")
    return report


def kept_at_end(f: RunFacts) -> tuple[int, int]:
    """(checkpoints, bytes) the run keeps once finished: keep_last, + every keep_every-th, + the best."""
    if f.finished or f.step >= f.max_steps:
        return f.kept, f.kept_bytes
    count = f.keep_last + (f.max_steps // f.keep_every if f.keep_every else 0) + int(f.keep_best)
    return max(count, f.kept), max(count * f.checkpoint_bytes, f.kept_bytes)


def _storage_lines(u: Usage, cost: CostConfig, f: RunFacts, ratio: float | None,
                   hours_left: float | None) -> list[Line]:
    count, final = kept_at_end(f)
    per_gib = cost.storage_gb_month * cost.soft_delete_days / DAYS_PER_MONTH  # USD per GiB deleted
    deleted = max(0, u.bytes_written - f.kept_bytes)
    written_at_end = None if ratio is None else u.bytes_written * (1 + ratio)
    deleted_later = None if written_at_end is None else max(0.0, written_at_end - final - deleted)
    wall_left = 0.0 if hours_left is None else hours_left / max(u.processes, 1)
    months_left = wall_left / HOURS_PER_MONTH + cost.keep_months
    return [
        Line("soft delete", deleted / GIB * per_gib, None if deleted_later is None else deleted_later / GIB * per_gib,
             f"{_n(deleted / GIB)} GiB deleted or overwritten x {cost.soft_delete_days:g} days "
             f"(cost.soft_delete_days) x ${cost.storage_gb_month:g}/GiB-month"),
        Line("stored", f.kept_bytes / GIB * cost.storage_gb_month * f.age_s / 3600 / HOURS_PER_MONTH,
             final / GIB * cost.storage_gb_month * months_left,
             f"{f.kept} checkpoint{'s' if f.kept != 1 else ''} ({_n(f.kept_bytes / GIB)} GiB) for the run's "
             f"{f.age_s / 3600:.1f} h so far; {count} ({_n(final / GIB)} GiB) kept {cost.keep_months:g} month"
             f"{'s' if cost.keep_months != 1 else ''} after (cost.keep_months) x ${cost.storage_gb_month:g}/GiB-month"),
    ]


def advice(report: CostReport, cost: CostConfig, f: RunFacts, writes: float) -> list[str]:
    """What to change when checkpoints (or another avoidable item) are a large share of the total, naming the
    settings and the numbers; [] when nothing stands out or the GPU is not priced (no total to compare with).
    ``writes``: USD of class A operations (writes, listings) so far and to finish, which saves make."""
    if cost.gpu_hour is None:
        return []
    total = report.so_far + report.to_finish
    if total <= 0:
        return []
    both = {line.item: (line.so_far or 0.0) + (line.to_finish or 0.0) for line in report.lines}
    checkpoints = both["stored"] + both["soft delete"] + both["replication"] + writes
    out = []
    if checkpoints >= CHECKPOINT_SHARE * total:
        out.append(f"checkpoints cost ${usd(checkpoints)} of ${usd(total)} ({checkpoints / total:.0%}; each save "
                   f"writes {_n(f.checkpoint_bytes / GIB)} GiB)")
        if f.every_steps:
            out.append(f"raise checkpoint.every_steps from {f.every_steps} to {4 * f.every_steps}: a quarter of the "
                       "saves (their writes, replication and soft-deleted bytes)")
        elif f.every_minutes:
            out.append(f"raise checkpoint.every_minutes from {f.every_minutes:g} to {4 * f.every_minutes:g}: a "
                       "quarter of the saves")
        if f.keep_last > 2:
            out.append(f"lower checkpoint.keep_last from {f.keep_last} to 2: {f.keep_last - 2} fewer checkpoints "
                       "stored")
        if f.keep_every:
            out.append(f"checkpoint.keep_every={f.keep_every} keeps every {f.keep_every}-th step for good: raise it "
                       "or set it to null")
    if cost.soft_delete_days and both["soft delete"] >= ITEM_SHARE * total:
        out.append(f"deleted checkpoints are billed {cost.soft_delete_days:g} more days: turn the bucket's soft "
                   "delete off (`gcloud storage buckets update gs://BUCKET --clear-soft-delete`), then set "
                   "cost.soft_delete_days=0")
    if cost.multi_region and both["replication"] >= ITEM_SHARE * total:
        out.append("every byte written to a multi-region bucket is replicated and billed: a regional bucket in the "
                   "GPU's region has no replication charge")
    if cost.cross_region and both["egress"] >= ITEM_SHARE * total:
        out.append("the bucket is in another region than the machine: put both in one region (no egress charge)")
    return out


def _scaled(so_far: float, ratio: float | None) -> float | None:
    return None if ratio is None else so_far * ratio


def _n(x: float) -> str:
    """A quantity with 3 significant digits (0.00123, 12.3, 1.23e+03 -> 1230)."""
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def usd(x: float | None) -> str:
    """USD to the cent from $10, else to 4 decimals, else (below a cent: a tiny run's) to 6."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    return f"{x:.6f}" if abs(x) < 0.01 else f"{x:.4f}" if abs(x) < 10 else f"{x:.2f}"


def format_cost(r: CostReport) -> list[str]:
    """The lines ``status --cost`` prints beneath the status."""
    out = [f"{'cost':<12} {'so far':>10} {'to finish':>10}  USD (prices: cost.* of the run's config)"]
    for line in r.lines:
        out.append(f"  {line.item:<11} {usd(line.so_far):>9} {usd(line.to_finish):>10}  {line.how}")
    out.append(f"  {'total':<11} {usd(r.so_far):>9} {usd(r.to_finish):>10}  ${usd(r.so_far + r.to_finish)} in all")
    if r.budget is not None:
        out.append(f"{'budget':<12} ${r.budget:g}: training has spent ${usd(r.spent)} of it "
                   f"({r.spent / r.budget:.0%}; gpu, operations, egress, replication)")
    out += [f"{'advice' if i == 0 else '':<12} {text}" for i, text in enumerate(r.advice)]
    out += [f"{'note' if i == 0 else '':<12} {text}" for i, text in enumerate(r.notes)]
    return out
