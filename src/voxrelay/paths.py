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
EXPORT_META = "voxrelay.json"  # in an export folder: tokenizer, vocabulary layout, speakers


def cache_dir(*parts: str) -> Path:
    """``$VOXRELAY_CACHE`` (default ``~/.cache/voxrelay``) / parts, created."""
    base = Path(os.environ.get("VOXRELAY_CACHE") or Path.home() / ".cache" / "voxrelay")
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def uri_key(uri: str) -> str:
    """A short, filesystem-safe key for a storage URI (to name its local cache folder)."""
    tail = "".join(c if c.isalnum() or c in "-_." else "_" for c in uri.rstrip("/").rsplit("/", 1)[-1])
    return f"{tail}-{hashlib.sha1(uri.encode()).hexdigest()[:10]}"


def rank_world() -> tuple[int, int]:
    """(rank, world size) from the torchrun/accelerate environment; (0, 1) when alone."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
