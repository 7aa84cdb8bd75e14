"""Metric sinks: JSONL (always), TensorBoard (default), wandb (optional).

Sinks write into a local run folder (the run folder itself when the root is local, else a cache
folder) and ``sync()`` copies the files to the run folder in storage (at checkpoints and the end): only those
changed (size or mtime) since this session's last sync, so TensorBoard's event files and the eval wavs are not
sent again at every checkpoint. A session's ``metrics.jsonl`` starts as the bucket's merged with this machine's
(lines another machine's sessions added, lines a session here logged but never uploaded): a stale local copy
never replaces the run's.
"""

from __future__ import annotations

import html
import json
import logging
import secrets
import string
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from voxrelay import storage
from voxrelay.errors import UserError, one_line
from voxrelay.paths import METRICS_FILE

log = logging.getLogger(__name__)
TB_DIR = "tensorboard"
WANDB_RUN_FILE = "wandb.json"  # {"id": ...}: the W&B run of this run folder, resumed by every session


class MonitorError(UserError, RuntimeError):
    """A metric sink the config asks for cannot start (e.g. wandb missing); the message says the fix."""


class MetricSink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...
    def log_audio(self, step: int, tag: str, wav: np.ndarray, sample_rate: int) -> None: ...
    def log_text(self, step: int, tag: str, text: str) -> None: ...
    def close(self) -> None: ...


class JsonlSink:
    """One JSON object per line: {"step", "time", **metrics}."""

    def __init__(self, path: Path):
        self.path = path

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, "time": round(time.time(), 3), **metrics}) + "\n")

    def log_audio(self, step: int, tag: str, wav: np.ndarray, sample_rate: int) -> None:
        pass

    def log_text(self, step: int, tag: str, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def read_jsonl(uri: str) -> list[dict]:
    """The records of a JSONL file written by :class:`JsonlSink` (local or in storage); [] when it does
    not exist. A line cut by a kill is skipped: the others still count."""
    if not storage.exists(uri):
        return []
    out = []
    for line in storage.read_text(uri).splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def merge_metrics(remote: str, local: Path) -> None:
    """``local`` becomes the run's ``remote`` metrics.jsonl plus the lines only ``local`` has (a session on this
    machine that never uploaded them), in time order: a local copy older than the bucket's (another machine
    trained the run since) never replaces it at the next sync."""
    theirs = storage.read_text(remote).splitlines() if storage.exists(remote) else []
    mine = local.read_text().splitlines() if local.exists() else []
    known = set(theirs)
    lines = [line for line in theirs + [m for m in mine if m not in known] if line.strip()]
    lines.sort(key=_logged_at)  # stable: lines of one time keep their order
    if lines != mine:
        local.write_text("".join(line + "\n" for line in lines))


def _logged_at(line: str) -> float:
    try:
        return float(json.loads(line).get("time", 0.0))
    except (ValueError, AttributeError, TypeError):
        return 0.0  # a line cut by a kill: kept (read_jsonl skips it), first


class TensorBoardSink:
    def __init__(self, logdir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(logdir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():  # a text beside the numbers (eval/asr: what WER/CER were measured with)
            if isinstance(value, str):
                self.writer.add_text(key, value, step)
            else:
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_audio(self, step: int, tag: str, wav: np.ndarray, sample_rate: int) -> None:
        """``wav`` float [N] at ``sample_rate``; a clip under 2 samples (a model that stopped at once generates none)
        is written as 2 samples of silence: TensorBoard refuses shorter ones, and the step must still show a clip."""
        wav = np.clip(np.asarray(wav, dtype=np.float32).reshape(-1), -1, 1)
        if wav.size < 2:
            wav = np.zeros(2, dtype=np.float32)
        self.writer.add_audio(tag, wav[None, :], step, sample_rate=sample_rate)
        self.writer.flush()

    def log_text(self, step: int, tag: str, text: str) -> None:
        self.writer.add_text(tag, text, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def import_wandb():
    try:
        import wandb
    except ImportError as e:
        raise MonitorError(
            f"monitor.wandb is true but wandb cannot be imported ({e}); install it with "
            "`pip install 'voxrelay[wandb]'` or set monitor.wandb=false"
        ) from None
    return wandb


def wandb_run_id(run_uri: str, guard: Callable[[], None] | None = None) -> str:
    """The id of the W&B run every session of the run at ``run_uri`` logs to: read from ``<run>/wandb.json``,
    or made and written there by the first session (``guard``: the run's lease check, before that write)."""
    uri = storage.join(run_uri, WANDB_RUN_FILE)
    if storage.exists(uri):
        try:
            return storage.check_name(str(storage.read_json(uri)["id"]), uri, single=True)  # names wandb's folder
        except (ValueError, KeyError, TypeError) as e:
            raise MonitorError(f"{uri} holds no W&B run id ({type(e).__name__}: {e}); delete it to log this run "
                               "to a new W&B run") from None
    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # as W&B's own
    if guard is not None:
        guard()
    storage.write_json(uri, {"id": run_id})
    return run_id


class WandbSink:
    def __init__(self, project: str, name: str, config: dict, run_id: str | None = None):
        """``run_id``: the W&B run to resume (or to create under that id); None: a new run."""
        self.wandb = wandb = import_wandb()
        try:
            self.run = wandb.init(project=project, name=name, config=config, id=run_id, resume="allow")
        except Exception as e:  # wandb's own error classes (no API key, no network) vary by version
            raise MonitorError(
                f"monitor.wandb is true but wandb.init failed for project {project!r} ({type(e).__name__}: {e}); "
                "run `wandb login` (or set WANDB_API_KEY), set WANDB_MODE=offline, or set monitor.wandb=false"
            ) from e

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_audio(self, step: int, tag: str, wav: np.ndarray, sample_rate: int) -> None:
        self.run.log({tag: self.wandb.Audio(wav, sample_rate=sample_rate)}, step=step)

    def log_text(self, step: int, tag: str, text: str) -> None:
        self.run.log({tag: self.wandb.Html(f"<pre>{html.escape(text)}</pre>")}, step=step)

    def close(self) -> None:
        self.run.finish()


class Monitor:
    """Fans metrics out to the sinks; only rank 0 has sinks. An eval gives its audio and transcripts to each sink
    itself (:mod:`voxrelay.train.evaluate`: one sink failing is one part of the eval failing)."""

    def __init__(self, sinks: list[MetricSink], local_dir: Path | None, run_uri: str,
                 guard: Callable[[], None] | None = None):
        self.sinks = sinks
        self.local_dir = local_dir
        self.run_uri = run_uri
        self.guard = guard  # the run's lease check: raises once another session owns the run folder
        self.synced: dict[str, tuple[int, int]] = {}  # relative path -> (size, mtime_ns) when it was last uploaded
        self._sync_thread: threading.Thread | None = None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Each sink on its own: one that fails (a full disk under TensorBoard's folder) is a warning, and the
        others still get the metrics (metrics.jsonl is what early stopping's record and ``status`` read)."""
        for sink in self.sinks:
            try:
                sink.log(step, metrics)
            except Exception as err:  # noqa: BLE001 (any sink's own error: the other sinks must still write)
                log.warning("the metrics of step %d were not written to %s (%s: %s)", step, type(sink).__name__,
                            type(err).__name__, one_line(err)[:300])

    def sync(self, wait: bool = False) -> None:
        """Copy the local metric files to a remote run folder in a background thread (no-op for a
        local root); a sync already running is not started twice."""
        if self.local_dir is None or storage.is_local(self.run_uri):
            return
        if self._sync_thread is not None and self._sync_thread.is_alive():
            if not wait:
                return
            self._sync_thread.join()
        self._sync_thread = threading.Thread(target=self._sync_files, name="voxrelay-metrics-sync", daemon=True)
        self._sync_thread.start()
        if wait:
            self._sync_thread.join()

    def _sync_files(self) -> None:
        try:
            self._copy_files()
        except Exception as err:  # metrics are re-sent at the next sync; training must go on
            log.warning("could not copy metrics to %s (%s); will retry at the next checkpoint", self.run_uri, err)

    def _copy_files(self) -> None:
        for path in sorted(self.local_dir.rglob("*")):
            if not path.is_file():
                continue
            rel, stat = path.relative_to(self.local_dir).as_posix(), path.stat()
            if self.synced.get(rel) == (stat.st_size, stat.st_mtime_ns):
                continue  # unchanged since this session uploaded it
            if self.guard is not None:  # before each object: a take-over during a sync stops it at the next file
                self.guard()
            storage.put_file(path, storage.join(self.run_uri, rel))
            self.synced[rel] = (stat.st_size, stat.st_mtime_ns)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sync(wait=True)


def build_monitor(cfg, run_uri: str, local_dir: Path, is_main: bool,
                  guard: Callable[[], None] | None = None) -> Monitor:
    """Sinks for the main process; a remote run's metrics.jsonl is first fetched so it continues."""
    if not is_main:
        return Monitor([], None, run_uri)
    local_dir.mkdir(parents=True, exist_ok=True)
    metrics = local_dir / METRICS_FILE
    remote = storage.join(run_uri, METRICS_FILE)
    if not storage.is_local(run_uri):
        merge_metrics(remote, metrics)
    sinks: list[MetricSink] = [JsonlSink(metrics)]
    if cfg.monitor.tensorboard:
        sinks.append(TensorBoardSink(local_dir / TB_DIR))
    if cfg.monitor.wandb:  # every session logs to the run's one W&B run
        import_wandb()  # a missing wandb stops before the run folder gets a W&B run id
        run_id = wandb_run_id(run_uri, guard)
        sinks.append(WandbSink(cfg.monitor.wandb_project, cfg.name, cfg.to_dict(), run_id))
    return Monitor(sinks, local_dir, run_uri, guard)
