"""Local working folders (cache, staging) and the process's place in a multi-process job."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# The layout of a run folder <root>/runs/<name>/ (here so that light commands need no heavy import)
CONFIG_SNAPSHOT = "config.yaml"  # the resolved config, written when training starts
CKPT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
LEASE_FILE = "lease.json"  # who writes the run now (voxrelay.checkpoint.lease)
USAGE_FILE = "usage.json"  # each session's GPU time and storage requests (voxrelay.cost.usage)
EXPORT_META = "voxrelay.json"  # in an export folder: tokenizer, vocabulary layout, speakers


def output_problem(path: str | Path) -> str | None:
    """Why a file or folder cannot be written at local ``path`` (a file where a folder must be, a folder
    this user cannot write), or None. Checked before any work, so that minutes of it are not lost at the end."""
    path = Path(path).absolute()
    for folder in path.parents:
        if folder.exists():
            if not folder.is_dir():
                return f"{folder} is a file, not a folder"
            if not os.access(folder, os.W_OK | os.X_OK):
                return f"{folder} is not writable by this user"
            return None
    return None


def cache_dir(*parts: str) -> Path:
    """``$VOXRELAY_CACHE`` (default ``~/.cache/voxrelay``) / parts, created."""
    base = Path(os.environ.get("VOXRELAY_CACHE") or Path.home() / ".cache" / "voxrelay")
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_location(run_uri: str) -> tuple[str, str] | None:
    """(root, name) of a run folder ``<root>/runs/<name>``, from where the folder is; None when ``run_uri`` is
    not laid out so. A run finds its prepared data from here, not from the root it was trained with: a root
    copied or synced elsewhere (another bucket, a local copy) works, from any working directory."""
    head, _, name = run_uri.rstrip("/").rpartition("/")
    parent, _, runs = head.rpartition("/")
    if runs != "runs" or not name or parent.endswith(":/"):  # s3://runs/x: the bucket itself is named "runs"
        return None
    return parent or ".", name


def located(cfg: dict, run_uri: str) -> dict:
    """A run's config snapshot (a dict) with ``root`` and ``name`` from where the run folder is."""
    where = run_location(run_uri)
    return cfg if where is None else {**cfg, "root": where[0], "name": where[1]}


def uri_key(uri: str) -> str:
    """A short, filesystem-safe key for a storage URI (to name its local cache folder); a local path is keyed by
    its absolute form, so ``./data`` and ``/home/me/data`` share one cache."""
    if "://" not in uri or uri.startswith("file://"):
        uri = os.path.abspath(uri.removeprefix("file://"))
    tail = "".join(c if c.isalnum() or c in "-_." else "_" for c in uri.rstrip("/").rsplit("/", 1)[-1])
    return f"{tail}-{hashlib.sha1(uri.encode()).hexdigest()[:10]}"


def rank_world() -> tuple[int, int]:
    """(rank, world size) from the torchrun/accelerate environment; (0, 1) when alone."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
