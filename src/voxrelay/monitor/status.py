"""``voxrelay status RUN``: where a run stands, from its run folder (any storage) and this
machine's staging folder."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from voxrelay import storage
from voxrelay.checkpoint.lease import describe, glance, read_lease
from voxrelay.checkpoint.staging import Staging
from voxrelay.checkpoint.stops import EARLY_STOP
from voxrelay.checkpoint.store import Checkpoint, CommittedStore
from voxrelay.errors import UserError
from voxrelay.monitor.limits import what_limits
from voxrelay.monitor.sinks import read_jsonl
from voxrelay.paths import (
    CKPT_DIR,
    CONFIG_SNAPSHOT,
    EXPORT_META,
    METRICS_FILE,
    USAGE_FILE,
    cache_dir,
    located,
    not_a_run,
    uri_key,
)

if TYPE_CHECKING:
    from voxrelay.cost.estimate import CostReport


class StatusError(UserError):
    """The folder given to ``status`` is not a run folder; the message names it and the fix."""


@dataclass
class CacheUse:
    """Bytes of this machine's ``$VOXRELAY_CACHE`` (all runs and datasets)."""

    folder: Path
    prepared: int  # local copies of prepared shards (bounded by cache.max_gb)
    staging: int  # staged checkpoints not yet uploaded, and fetched ones being loaded

    @property
    def total(self) -> int:
        return self.prepared + self.staging


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 if missing); files removed meanwhile (a trainer
    running beside us) are skipped."""
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except FileNotFoundError:
                continue
    return total


def cache_use() -> CacheUse:
    base = cache_dir()
    return CacheUse(base, folder_bytes(base / "prepared"), folder_bytes(base / "staging"))


@dataclass
class RunStatus:
    run_uri: str
    max_steps: int | None
    step: int  # newest step known (checkpoint or metrics)
    durable_step: int | None
    durable_time: float | None
    durable_uri: str | None
    staged_steps: list[int] = field(default_factory=list)
    steps_per_sec: float | None = None
    tokens_per_sec: float | None = None
    audio_sec_per_sec: float | None = None
    last_eval: dict = field(default_factory=dict)
    cache: CacheUse | None = None
    stop_reason: str | None = None  # why the newest committed checkpoint's session stopped early, if it did
    writer: dict | None = None  # the run's lease record (who trains it now, or last did)
    limits: list[str] = field(default_factory=list)  # what sets the pace, from the newest throughput reports
    cost: CostReport | None = None  # with --cost: spend so far and to finish (voxrelay.cost)

    @property
    def finished(self) -> bool:
        if self.stop_reason == EARLY_STOP.reason:
            return True
        return self.max_steps is not None and self.durable_step is not None and self.durable_step >= self.max_steps

    @property
    def eta_seconds(self) -> float | None:
        if self.finished or not self.steps_per_sec or self.max_steps is None:
            return None
        return (self.max_steps - self.step) / self.steps_per_sec


def _metrics(run_uri: str) -> list[dict]:
    return read_jsonl(storage.join(run_uri, METRICS_FILE))


def run_status(run_uri: str, cost: bool = False) -> RunStatus:
    snapshot = storage.join(run_uri, CONFIG_SNAPSHOT)
    if not storage.exists(snapshot):
        raise StatusError(
            f"{not_a_run(run_uri)}; pass the run folder <root>/runs/<name> with the `root` and `name` of the "
            "run's config (it exists once `voxrelay train` has started)"
        )
    cfg = located(yaml.safe_load(storage.read_text(snapshot)) or {}, run_uri)
    # the store and staging alone: status must not import torch (it answers in well under 2 s)
    committed = CommittedStore(storage.join(run_uri, CKPT_DIR)).list()
    staging = Staging(cache_dir("staging", uri_key(run_uri)))
    staged = [c.step for c in staging.list() if not committed or c.step > committed[0].step]
    metrics = _metrics(run_uri)
    logged = [m for m in metrics if "tokens_per_sec" in m]
    evals = [m for m in metrics if any(k.startswith("eval/") for k in m)]
    newest = max([m["step"] for m in metrics] + [c.step for c in committed] + staged, default=0)
    status = RunStatus(
        run_uri, cfg.get("train", {}).get("max_steps"), newest,
        committed[0].step if committed else None,
        committed[0].manifest.get("time") if committed else None,
        committed[0].uri if committed else None, staged,
        last_eval={k: v for k, v in (evals[-1] if evals else {}).items() if k.startswith("eval/")},
        cache=cache_use(), stop_reason=committed[0].manifest.get("stopped") if committed else None,
        writer=read_lease(run_uri),
    )
    size = sum(int(f.get("size", 0)) for f in committed[0].manifest.get("files", {}).values()) if committed else None
    data = cfg.get("data", {}).get("name", "demo")
    status.limits = what_limits(logged, size, storage.join(str(cfg.get("root", "./voxrelay-data")), "prepared", data))
    if logged:
        status.tokens_per_sec = logged[-1]["tokens_per_sec"]
        status.audio_sec_per_sec = logged[-1]["audio_sec_per_sec"]
        window = logged[-5:]
        if len(window) >= 2 and window[-1]["time"] > window[0]["time"]:
            status.steps_per_sec = (window[-1]["step"] - window[0]["step"]) / (window[-1]["time"] - window[0]["time"])
    if cost:
        status.cost = run_cost(status, cfg, committed)
    return status


def run_cost(s: RunStatus, cfg: dict, committed: list[Checkpoint]) -> CostReport:
    """The cost estimate of a run (``status --cost``): its sessions' usage (``usage.json``), the checkpoints it
    keeps (their manifests' sizes) and the prices of its config's ``cost`` section."""
    from voxrelay.cost.config import CostConfig  # pydantic: only with --cost
    from voxrelay.cost.estimate import RunFacts, cost_report
    from voxrelay.cost.usage import read_sessions, usage_of

    sessions = read_sessions(s.run_uri)
    sizes = [sum(int(f.get("size", 0)) for f in c.manifest.get("files", {}).values()) for c in committed]
    ck = cfg.get("checkpoint") or {}
    now = time.time()
    last = max((x.get("updated", now) for x in sessions), default=now)
    facts = RunFacts(  # age: from the first session's start to the last's record (a live one renews it)
        s.step, s.max_steps or s.step, s.finished, s.steps_per_sec, len(committed), sum(sizes),
        sizes[0] if sizes else 0, last - min((x.get("started", now) for x in sessions), default=now),
        ck.get("keep_last", 2), ck.get("keep_every"), ck.get("keep_best", False), ck.get("every_steps"),
        ck.get("every_minutes"),
    )
    report = cost_report(usage_of(sessions), CostConfig.model_validate(cfg.get("cost") or {}), facts)
    if storage.is_local(s.run_uri) and (report.line("operations").so_far or report.line("stored").so_far):
        report.notes.append("the run's root is a folder (a local disk or a mount): requests and storage are "
                            "priced at the cost section's bucket prices (GCS Standard by default); a local disk bills "
                            "neither: cost.class_a_per_10k=0 cost.class_b_per_10k=0 cost.storage_gb_month=0 (keep "
                            "them for a mounted bucket, e.g. gcsfuse)")
    if not sessions:
        report.notes.append(f"no usage recorded yet ({USAGE_FILE} is written by `voxrelay train` at every checkpoint; "
                            "a run trained before it existed has none): GPU time and requests are unknown")
    return report


def format_status(s: RunStatus) -> str:
    lines = [f"run          {s.run_uri}", f"steps        {s.step} of {s.max_steps}"]
    if s.durable_step is None:
        lines.append("durable      no committed checkpoint yet")
    else:
        age = time.time() - (s.durable_time or time.time())
        lines.append(f"durable      step {s.durable_step}, {age / 60:.1f} min ago, at {s.durable_uri}")
    lines.append(f"staged       {', '.join(map(str, s.staged_steps)) or 'none'} (on this machine, not yet uploaded)")
    if s.tokens_per_sec is not None:
        lines.append(f"throughput   {s.tokens_per_sec:.0f} tok/s, {s.audio_sec_per_sec:.1f} audio-s/s")
    lines += [f"{'limits' if i == 0 else '':<12} {line}" for i, line in enumerate(s.limits)]
    eta = s.eta_seconds
    lines.append(f"eta          {'-' if eta is None else f'{eta / 60:.1f} min'}")
    if s.last_eval:
        from voxrelay.quality.scorer import said_by

        said = [f"({line})" for line in said_by(s.last_eval)]
        lines.append("last eval    " + ", ".join(f"{k[5:]} {v:.3f}" for k, v in s.last_eval.items()
                                                 if not isinstance(v, str)) + "".join(f" {w}" for w in said))
    if s.cache is not None:
        c = s.cache
        lines.append(f"local cache  {_size(c.total)} (prepared {_size(c.prepared)}, staging {_size(c.staging)}) "
                     f"in {c.folder}")
    lines.append(f"writer       {_writer(s.writer)}")
    done = "no" if not s.finished else "yes (early stopping)" if s.stop_reason == EARLY_STOP.reason else "yes"
    if not s.finished and s.stop_reason:
        done += f" (the last session stopped: {s.stop_reason})"
    lines.append(f"finished     {done}")
    if s.cost is not None:
        from voxrelay.cost.estimate import format_cost

        lines += format_cost(s.cost)
    return "\n".join(lines)


def _writer(lease: dict | None) -> str:
    """Who holds the run's lease (voxrelay.checkpoint.lease), from its record, judged without comparing clocks."""
    if not lease:
        return "none"
    state = glance(lease)
    if state != "held":
        how = {"released": "released it", "dead": "died on this machine"}.get(state, "left no valid lease")
        return f"none (the last session, host {lease.get('host')} pid {lease.get('pid')}, {how})"
    return (f"{describe(lease)}; a holder gone elsewhere is taken over once its renewal counter stays unchanged "
            "for its lease (`train` watches it)")


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class VoiceInput:
    """How a model is given its voices: ``names`` of the training data's voices (``synthesize --voice NAME``;
    none: a single-speaker model), or, when ``prompts``, a reference clip per speaker of the script
    (``--voice 0=a.wav --voice 1=b.wav``), for a family that clones voices from prompts."""

    family: str
    prompts: bool
    names: list[str]


def voice_input(source: str) -> VoiceInput:
    """What a run folder or an export folder takes as voices (JSON/YAML only: no model is loaded)."""
    from voxrelay.models.registry import DEFAULT_FAMILY, FAMILIES

    if storage.is_local(source) and (Path(storage.local_path(source)) / EXPORT_META).is_file():
        meta = json.loads((Path(storage.local_path(source)) / EXPORT_META).read_text())
        family, names = meta.get("family", DEFAULT_FAMILY), list(meta.get("speakers", []))
    else:
        snapshot = storage.join(source, CONFIG_SNAPSHOT)
        if not storage.exists(snapshot):
            raise StatusError(f"{source} is neither a run folder (no {CONFIG_SNAPSHOT}) nor an export folder (no "
                              f"{EXPORT_META}); pass <root>/runs/<name> or a folder written by `voxrelay export`")
        cfg = located(yaml.safe_load(storage.read_text(snapshot)) or {}, source)
        family = (cfg.get("model") or {}).get("family", DEFAULT_FAMILY)
        root, data = cfg.get("root", "."), (cfg.get("data") or {}).get("name", "demo")
        index_uri = storage.join(root, "prepared", data, "index.json")
        if not storage.exists(index_uri):
            raise StatusError(f"the prepared data of {source} ({index_uri}) is gone; re-run `voxrelay prepare` with "
                              "the run's config to restore it")
        names = list(storage.read_json(index_uri).get("speakers", []))
    spec = FAMILIES.get(family)
    return VoiceInput(family, bool(spec is not None and spec.config.model_construct().data_needs().voice_prompts),
                      names)
