"""What limits a run's pace, read from its throughput reports (``metrics.jsonl``): waiting for batches, uploads
falling behind the saves, a staging disk filling up; for ``voxrelay status``. Pure functions: no torch."""

from __future__ import annotations

DATA_BOUND = 0.25  # the share of the wall time spent waiting for batches from which a run is data-bound
BACKLOG = 2  # staged checkpoints waiting for upload from which uploads are falling behind


def what_limits(reports: list[dict], checkpoint_bytes: int | None = None, data_uri: str | None = None) -> list[str]:
    """One line per limit seen in the newest throughput ``reports`` (each a metrics.jsonl line with
    ``tokens_per_sec``), with the fix; ``checkpoint_bytes``: the size of one checkpoint, when known;
    ``data_uri``: where the training shards come from."""
    if not reports:
        return []
    recent = reports[-5:]
    last = recent[-1]
    found = []
    waits = [r["data_wait"] for r in recent if "data_wait" in r]
    if waits and sum(waits) / len(waits) >= DATA_BOUND:
        rate = f" at {last['shard_mb_s']:.1f} MB/s a stream" if "shard_mb_s" in last else ""
        source = f" (shards from {data_uri}{rate})" if data_uri else ""
        found.append(f"data-bound: {100 * sum(waits) / len(waits):.0f}% of the time waiting for batches{source}; "
                     "raise train.prefetch_batches and cache.prefetch_shards, keep the bucket in the GPU's region, "
                     "or use fewer, longer examples per batch")
    backlog = int(last.get("staging_backlog", 0))
    if backlog >= BACKLOG:
        rate = f" at {last['upload_mb_s']:.1f} MB/s" if "upload_mb_s" in last else ""
        found.append(f"upload-bound: {backlog} checkpoints staged, waiting for the bucket{rate}; save less often "
                     "(checkpoint.every_minutes) or to a faster bucket")
    free = last.get("staging_free_gb")
    if free is not None and checkpoint_bytes and free * 1e9 < 2 * checkpoint_bytes:
        found.append(f"staging disk nearly full: {free:.1f} GB free for checkpoints of "
                     f"{checkpoint_bytes / 1e9:.1f} GB; free space there or point VOXRELAY_CACHE at a larger disk")
    if last.get("shards_uncached", 0) > 0:
        room = f" ({last['cache_free_gb']:.1f} GB free)" if "cache_free_gb" in last else ""
        found.append(f"shard cache disk nearly full{room}: {int(last['shards_uncached'])} shards were read into "
                     "memory instead of cached (cache.min_free_gb); free space there, lower cache.max_gb, or point "
                     "VOXRELAY_CACHE at a larger disk")
    return found or ["nothing seen: no wait on batches or uploads (the model's compute sets the pace)"]
