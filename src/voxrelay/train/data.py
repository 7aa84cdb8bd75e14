"""The training data of a run: its batch plan and the stream of batches the loop takes.

A family whose examples draw on other rows (``uses_corpus``: VibeVoice's voice prompts) gets the split in
memory, as it needs every row at hand. Every other family streams: the plan comes from the row index and
the cached example lengths (:mod:`voxrelay.data.rowindex`: no codes are read to start), and rows are
fetched shard by shard as the plan needs them (:mod:`voxrelay.data.stream`), within ``cache.ram_gb`` of
memory and ``cache.max_gb`` of disk.
"""

from __future__ import annotations

import logging

import numpy as np

from voxrelay.config import RunConfig
from voxrelay.data.loader import BatchPlan, BatchStream, PreparedDataset
from voxrelay.data.rowindex import RowIndex, cached_lengths, lengths_key, shard_lengths, store_lengths
from voxrelay.data.shard_cache import ShardCache
from voxrelay.data.stream import ShardSource, StreamBatches
from voxrelay.errors import UserError
from voxrelay.models.base import FamilyModel
from voxrelay.paths import cache_dir
from voxrelay.train.ranks import Ranks

log = logging.getLogger(__name__)


def square_budget(model: FamilyModel, tc) -> int | None:  # noqa: ANN001 (tc: the train section)
    """count x longest² a padded batch may hold: ``train.batch_tokens`` x the family's ``full_budget_length`` (None:
    no cap, or a budget in seconds)."""
    if model.full_budget_length is None or tc.batch_tokens is None:
        return None
    return int(tc.batch_tokens) * int(model.full_budget_length)


def build_stream(model: FamilyModel, cfg: RunConfig, index: dict, rank: int, world: int, ranks: Ranks,
                 rows: list | None = None, packed: bool = False) -> BatchStream:
    """This process's stream of training batches. ``rows``: the split in memory (for a family that uses the
    corpus); ``ranks``: the job's processes (the lengths are computed once, shared among them, and cached);
    ``packed``: batches in one row each (:func:`packing`)."""
    tc = cfg.train
    if rows is not None:
        if packed:
            raise ValueError("packed batches of a family that uses the corpus are not supported")
        lengths = np.asarray([model.length(r) for r in rows], dtype=np.int64)
        keep = _kept(model, lengths)
        plan = BatchPlan(lengths[keep], [rows[i].duration for i in keep], tc.seed,
                         batch_tokens=tc.batch_tokens, batch_seconds=tc.batch_seconds,
                         square_budget=square_budget(model, tc))

        def make_batch(ids: list[int]) -> dict:
            picked = [rows[keep[i]] for i in ids]
            batch = model.collate([model.example(r) for r in picked])
            batch["audio_seconds"] = sum(r.duration for r in picked)
            return batch

        return BatchStream(plan, make_batch, rank, world, ahead=tc.prefetch_batches)
    index_rows = RowIndex.load(cfg.prepared_uri, index, "train")
    lengths = example_lengths(model, cfg, index, index_rows, ranks)
    keep = _kept(model, lengths)
    plan = BatchPlan(lengths[keep], index_rows.duration[keep], tc.seed, batch_tokens=tc.batch_tokens,
                     batch_seconds=tc.batch_seconds, shards=index_rows.shard[keep], window=tc.shuffle_window,
                     packed=packed, square_budget=square_budget(model, tc))
    cc = cfg.cache
    cache = ShardCache(cache_dir("prepared"), int(cc.max_gb * 2**30), int(cc.min_free_gb * 1e9))
    source = ShardSource(cfg.prepared_uri, index["num_codebooks"], index_rows, cache, int(cc.ram_gb * 2**30))
    collate = model.collate_packed if packed else model.collate
    batches = StreamBatches(source, keep, model.example, collate, cc.prefetch_shards)
    return BatchStream(plan, batches, rank, world, ahead=tc.prefetch_batches)


def packing(model: FamilyModel, cfg: RunConfig) -> bool:
    """Whether this run's batches are packed (``train.packing``): ``auto`` where the family can pack, ``true``
    refused (exit 2, with the reason and the fix) where it cannot."""
    setting, refusal = cfg.train.packing, model.packing_refusal
    if refusal is None:
        return setting is not False
    if setting is True:
        raise UserError(f"train.packing=true, but model.family={cfg.model.family} cannot pack batches: {refusal}. "
                        "Set train.packing=auto (or false)")
    if setting == "auto":
        log.info("batches are not packed: model.family=%s %s", cfg.model.family, refusal)
    return False


def example_lengths(model: FamilyModel, cfg: RunConfig, index: dict, rows: RowIndex, ranks: Ranks) -> np.ndarray:
    """Every training row's example length: cached in the bucket by an earlier session (rank 0 reads it), else
    computed from the shards' text columns by every process for its share of the shards (rank 0 caches them)."""
    key = lengths_key(cfg.model.model_dump(mode="json"), index, "train")
    cached = ranks.on_main(lambda: cached_lengths(key, cfg.prepared_uri, len(rows)))
    if cached is not None:
        return cached
    mine = ranks.each(lambda: shard_lengths(model.length, cfg.prepared_uri, rows,
                                            range(ranks.rank, len(rows.shards), ranks.world)))
    parts = ranks.gather(mine)  # parts[r][i]: shard r + i * world
    by_shard = [parts[s % ranks.world][s // ranks.world] for s in range(len(rows.shards))]
    lengths = np.concatenate(by_shard).astype(np.int32) if by_shard else np.zeros(0, np.int32)
    if len(lengths) != len(rows):
        raise UserError(f"the shards of {cfg.prepared_uri} hold {len(lengths)} training rows, its row index "
                        f"{len(rows)}: the prepared data changed while it was read; run `voxrelay prepare` again")
    if ranks.main:
        store_lengths(key, cfg.prepared_uri, lengths)
    return lengths


def check_trainable(prepared_uri: str, index: dict) -> None:
    """Stop, with the counts and the fix, before anything is built on prepared data without a training row
    (data committed by a voxrelay whose prepare did not refuse it)."""
    counts = index.get("counts", {})
    if not counts.get("train"):
        raise UserError(
            f"the prepared data at {prepared_uri} has no training rows ({counts.get('train', 0)} train, "
            f"{counts.get('eval', 0)} eval, {counts.get('rejected', 0)} rejected; the reasons are in "
            f"{prepared_uri.rstrip('/')}/rejects.jsonl): fix the sources or data.eval_size and run `voxrelay prepare` "
            "again (it now stops, naming the reasons, when it keeps no training row)")


def check_same_codec(cfg: RunConfig, index: dict) -> None:
    """Stop a run whose ``codec.*`` settings are not those its prepared data was made with: training reads the data
    as it is, so the run's config would record a codec the data does not hold (and a later session with the data's
    settings could not resume)."""
    from voxrelay.data.identity import config_changes

    params = (index.get("identity") or {}).get("params")
    changed = [c for c in config_changes(cfg, params) if c.startswith("codec.")] if params else []
    if changed:
        raise UserError(
            f"data.name={cfg.data.name} holds data prepared with other codec settings than this config's "
            f"({'; '.join(changed)}): point data.name at data prepared with this config (`voxrelay prepare CONFIG`), "
            "or set codec.* as that data was prepared (its index.json's codec)")


def _kept(model: FamilyModel, lengths: np.ndarray) -> np.ndarray:
    """Positions of the rows whose example fits ``max_length`` (the others are left out, with a warning)."""
    keep = np.flatnonzero(lengths <= model.max_length).astype(np.int32)
    key = model.max_length_key
    if not len(keep):
        raise UserError(
            f"none of the {len(lengths)} training rows fits {key}={model.max_length} (their examples take "
            f"{int(lengths.min())} to {int(lengths.max())} tokens): raise {key} to at least {int(lengths.min())} "
            f"({int(lengths.max())} keeps every row), or prepare shorter clips (data.max_duration)")
    if len(keep) < len(lengths):
        log.warning("%d of %d rows are longer than %s=%d and left out of training (raise it to keep them; the "
                    "longest is %d tokens)", len(lengths) - len(keep), len(lengths), key, model.max_length,
                    int(lengths.max()))
    return keep


def eval_split(cfg: RunConfig, index: dict) -> list:
    """The eval split in memory (it is small: ``data.eval_size`` rows), sorted by id."""
    cap = int(cfg.cache.max_gb * 2**30)
    return sorted(PreparedDataset.open(cfg.prepared_uri, "eval", index, max_bytes=cap).rows, key=lambda r: r.id)
