"""``voxrelay prepare``: sources -> validated utterances -> codec codes -> Parquet shards + index.json.

Every row is validated; a bad row is rejected with its reason (``rejects.jsonl`` + a summary) or,
with ``strict``, stops the run at the first one. Shards are committed one by one (a ``.done``
marker after the Parquet file), so a killed prepare re-run skips what is committed. Several
processes (torchrun/accelerate: RANK, WORLD_SIZE) split the shards; rank 0 fits the codec first
and writes ``index.json`` last, once every shard is committed, unless the rejects stop it (no training
row, or more than ``data.max_reject_fraction`` rejected: :mod:`voxrelay.data.rejects`). When every source
is gone but the data is committed (a later session), the committed data stands
(:mod:`voxrelay.data.sources_gone`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import Counter

import numpy as np
import torch

from voxrelay import storage
from voxrelay.codecs.base import AudioCodec, FittableCodec
from voxrelay.codecs.registry import build_codec, codec_from_description
from voxrelay.config import RunConfig
from voxrelay.data import identity as ident
from voxrelay.data import rejects as rj
from voxrelay.data import rowindex
from voxrelay.data import shards as sh
from voxrelay.data.audio import load_utterance_audio
from voxrelay.data.encode import StrictStop, encode_shard
from voxrelay.data.needs import check_codec_type, family_needs
from voxrelay.data.shards import PrepareError, load_index
from voxrelay.data.sources import SourceMissing, read_source
from voxrelay.data.sources_gone import SourcesGone, committed_without_sources
from voxrelay.data.types import PrepareReport, RowError, Utterance
from voxrelay.models.base import DataNeeds
from voxrelay.paths import cache_dir, rank_world

log = logging.getLogger(__name__)
FIT_CLIPS = 1500
WAIT_TIMEOUT_S = 6 * 3600


def collect_rows(cfg: RunConfig) -> list[Utterance]:
    """All source rows in a stable order; a duplicate id gets its ``problem`` set like any bad row,
    so every reject is reported in one place (the shard that holds it). Raises :class:`SourcesGone` when
    every source is missing, the first source's :class:`SourceMissing` when some are."""
    rows, seen, missing = [], {}, []
    workdir = str(cache_dir("sources"))
    for src in cfg.data.sources:
        try:
            for utt in read_source(src, workdir):
                if utt.problem is None and utt.id in seen:
                    utt.problem = f"duplicate id {utt.id!r} (first seen at {seen[utt.id]}); ids must be unique"
                seen.setdefault(utt.id, utt.where)
                rows.append(utt)
        except SourceMissing as err:
            missing.append(err)
    if missing and len(missing) == len(cfg.data.sources):
        raise SourcesGone([str(e) for e in missing])
    if missing:
        raise missing[0]
    return rows


def plan_shards(rows: list[Utterance], eval_size: int, shard_size: int) -> dict[str, list[Utterance]]:
    """Split rows into named shards. The eval split is the ``eval_size`` rows with the smallest
    hash of their id: stable when rows are added, and independent of row order."""
    by_hash = sorted((u for u in rows if u.problem is None), key=lambda u: hashlib.sha1(u.id.encode()).hexdigest())
    eval_ids = {id(u) for u in by_hash[:eval_size]}
    plan: dict[str, list[Utterance]] = {}
    for split in ("train", "eval"):
        part = [u for u in rows if (id(u) in eval_ids) == (split == "eval")]
        for i in range(0, len(part), shard_size):
            plan[f"{split}-{i // shard_size:05d}"] = part[i : i + shard_size]
    return plan


def _check_usable(rows: list[Utterance], cfg: RunConfig, strict: bool, rank: int) -> None:
    """Stop before the codec is built when no row is usable: every reject listed (or, with ``strict``, the
    first) and written to rejects.jsonl."""
    if any(u.problem is None for u in rows):
        return
    if not rows:
        raise PrepareError(f"the sources hold no rows ({', '.join(s.path or s.type for s in cfg.data.sources)}); "
                           "check data.sources")
    rejects = [{"id": u.id, "where": u.where, "reason": u.problem} for u in rows]
    stop = StrictStop(rejects[0]) if strict else PrepareError(rj.stop_message(
        f"prepare kept no row: {len(rows)} of {len(rows)} rows rejected", rejects, cfg.prepared_uri))
    if rank == 0:
        rj.write(cfg.prepared_uri, rejects[:1] if strict else rejects)
    raise stop


def _load_codec(cfg: RunConfig, codec: AudioCodec, rows: list[Utterance], rank: int) -> str | None:
    """Fit a fittable codec once (rank 0) and share its state via storage; record the codec's
    parameters (``codec.json``, written after the state). Returns the state's sha256 (None if none)."""
    record_uri = storage.join(cfg.prepared_uri, ident.CODEC_PARAMS_FILE)
    params = ident.codec_params(cfg, codec)
    if not isinstance(codec, FittableCodec):
        if rank == 0:
            _write_if_changed(record_uri, {"params": params, "state_sha256": None})
        return None
    state_uri = storage.join(cfg.prepared_uri, sh.CODEC_STATE_FILE)
    if rank == 0:
        _drop_stale_codec_state(cfg.prepared_uri, params)
    if rank == 0 and not storage.exists(state_uri):
        wavs, failed, pick = fit_sample(cfg, codec, rows)
        if not wavs:
            rj.write(cfg.prepared_uri, failed)
            headline = (f"prepare kept no row: {len(rows)} of {len(rows)} rows rejected" if len(pick) == len(rows)
                        else f"no row to fit the codec on: the {len(pick)} rows sampled (of {len(rows)}) were all "
                        "rejected")
            raise PrepareError(rj.stop_message(headline, failed, cfg.prepared_uri))
        t0 = time.time()
        codec.fit(wavs, seed=cfg.train.seed)
        log.info("fitted %s on %d clips in %.1fs", codec.name, len(wavs), time.time() - t0)
        storage.write_bytes(state_uri, codec.state_bytes())
    if rank == 0 and not storage.exists(record_uri):
        state = storage.read_bytes(state_uri)
        storage.write_json(record_uri, {"params": params, "state_sha256": ident.sha256_bytes(state)})
    # wait for the record of THIS config's codec (with --overwrite, rank 0 may be refitting it)
    _wait_for(record_uri, "the codec fitted by rank 0",
              ready=lambda: storage.read_json(record_uri).get("params") == params)
    state = storage.read_bytes(state_uri)
    codec.load_state_bytes(state)
    return ident.sha256_bytes(state)


def fit_sample(cfg: RunConfig, codec: AudioCodec, rows: list[Utterance]) -> tuple[list, list[dict], list[int]]:
    """The clips a fittable codec is fitted on: up to :data:`FIT_CLIPS` rows drawn with ``train.seed``; returns
    (their audio, the rows that could not be read with the reason, the indices drawn)."""
    rng = np.random.default_rng(cfg.train.seed)
    pick = rng.permutation(len(rows))[:FIT_CLIPS]
    wavs, failed = [], []
    for i in sorted(pick):
        try:
            if rows[i].problem is not None:
                raise RowError(rows[i].problem)
            wavs.append(load_utterance_audio(rows[i], codec.sample_rate, cfg.data.min_duration, cfg.data.max_duration))
        except RowError as err:  # else rejected (with its reason) when its shard is encoded
            failed.append({"id": rows[i].id, "where": rows[i].where, "reason": str(err)})
    return wavs, failed, list(pick)


def _drop_stale_codec_state(prepared: str, params: dict) -> None:
    """Delete a fitted state made with other parameters (check_params already stopped if a committed
    dataset uses it) or one without its record (a prepare killed in between)."""
    record, state = storage.join(prepared, ident.CODEC_PARAMS_FILE), storage.join(prepared, sh.CODEC_STATE_FILE)
    if storage.exists(record):
        stale = storage.read_json(record).get("params") != params
    else:  # a state without record is kept only for the committed dataset of an older voxrelay
        stale = storage.exists(state) and not storage.exists(storage.join(prepared, sh.INDEX_FILE))
    if stale:
        log.warning("the fitted codec state in %s was made with other parameters; fitting it again", prepared)
        storage.delete(record)  # first: other ranks wait for a record with this config's parameters
        storage.delete(state)


def _write_if_changed(uri: str, obj: dict) -> bool:
    """Write JSON unless the object there is already equal (a prepare that changes nothing writes nothing)."""
    if storage.exists(uri) and storage.read_json(uri) == obj:
        return False
    storage.write_json(uri, obj)
    return True


def _wait_for(uri: str, what: str, timeout: float = WAIT_TIMEOUT_S, ready=None) -> None:
    deadline = time.time() + timeout
    while not storage.exists(uri) or (ready is not None and not ready()):
        if time.time() > deadline:
            raise PrepareError(f"waited {timeout:.0f}s for {what} ({uri}); did another process die?")
        time.sleep(1.0)


def _write_index(cfg: RunConfig, codec: AudioCodec, plan: dict[str, list[Utterance]], params: dict):
    """Merge the shard markers into rejects.jsonl and write index.json (the commit marker) last, unless the
    rejects stop it (:func:`voxrelay.data.rejects.gate`: then no index.json is left, as the shards it would
    name are not committed); files whose content would not change are left as they are."""
    prepared = cfg.prepared_uri
    shard_infos, rejects, counts, seconds, speakers, ids = [], [], Counter(), 0.0, set(), {}
    metas: dict[str, list[dict]] = {}
    for name in plan:
        marker = storage.read_json(sh.marker_uri(prepared, name))
        ids[name] = marker["ids_sha1"]
        rejects += marker["rejects"]
        split = name.split("-")[0]
        counts[split] += marker["rows"]
        seconds += marker["seconds"]
        speakers.update(marker["speakers"])
        shard_infos.append({"name": name, "split": split, "rows": marker["rows"], "seconds": marker["seconds"]}
                           | ({"sha256": marker["sha256"]} if marker.get("sha256") else {}))  # older markers: none
        metas.setdefault(split, []).append(marker.get("rows_meta") or rowindex.meta_of_shard(prepared, name))
    rj.write(prepared, rejects)
    index = {
        "format_version": sh.FORMAT_VERSION,
        "name": cfg.data.name,
        "codec": codec.describe(),
        "codec_state": sh.CODEC_STATE_FILE if isinstance(codec, FittableCodec) else None,
        "num_codebooks": codec.num_codebooks,
        "shards": shard_infos,
        "counts": {"train": counts["train"], "eval": counts["eval"], "rejected": len(rejects)},
        "hours": seconds / 3600,
        "speakers": sorted(speakers),
        "identity": ident.identity(ids, params["codec.state_sha256"], params),
        "row_index": {split: rowindex.write_row_index(prepared, split, m) for split, m in metas.items()},
    }
    index_uri = storage.join(prepared, sh.INDEX_FILE)
    refusal = rj.gate(index["counts"], rejects, cfg.data.max_reject_fraction, cfg.data.eval_size)
    if refusal:
        storage.delete(index_uri)  # an index of the shards before this prepare re-encoded them
        raise PrepareError(rj.stop_message(refusal, rejects, prepared))
    old = storage.read_json(index_uri) if storage.exists(index_uri) else {}
    if {k: v for k, v in old.items() if k != "created"} != index:
        index["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        storage.write_json(index_uri, index)
    return index, rejects


def _committed(prepared: str, name: str, ids_sha: str, params: dict) -> bool:
    """A shard is reused only if its marker exists, it holds the same rows (sources unchanged) and
    it was made with the same parameters (codec, its fitted state, duration bounds)."""
    uri = sh.marker_uri(prepared, name)
    if not storage.exists(uri):
        return False
    marker = storage.read_json(uri)
    if marker.get("ids_sha1") != ids_sha:
        log.warning("shard %s was prepared from other rows (the sources or the train/eval split changed); preparing "
                    "it again", name)
        return False
    if marker.get("params", params) != params:  # markers of older versions carry no params
        changed = ident.changed_keys(marker["params"], params) or ["the fitted codec state"]
        log.warning("shard %s was prepared with other parameters (%s); preparing it again", name, ", ".join(changed))
        return False
    return True


def _committed_params(prepared: str) -> dict | None:
    """The parameters the committed dataset (index.json) was made with; None if there is none."""
    uri = storage.join(prepared, sh.INDEX_FILE)
    if not storage.exists(uri):
        return None
    index = storage.read_json(uri)
    if "identity" in index:
        return index["identity"]["params"]
    # an index of an older voxrelay: only its codec description is known
    return {f"codec.{k}": v for k, v in index.get("codec", {}).items() if k not in ident.DECODE_ONLY}


def check_params(cfg: RunConfig, codec: AudioCodec, overwrite: bool, rank: int) -> None:
    """Compare this config with the parameters of the committed dataset, before anything is written.

    A committed dataset made with other parameters (codec.*, data.min/max_duration, ...) is never
    mixed with new shards: without ``overwrite`` this stops with the changed keys and the ways out;
    with it, rank 0 uncommits the dataset (index.json) and the codec state if the codec changed, and
    every affected shard is encoded again."""
    old = _committed_params(cfg.prepared_uri)
    if old is None:
        return
    new = ident.shard_params(cfg, codec, None)
    keys = new if "codec.state_sha256" in old else old  # an older index knows only its codec keys
    changed = ident.changed_keys({k: old.get(k) for k in keys}, {k: new.get(k) for k in keys})
    if not changed:
        return
    if not overwrite:
        raise PrepareError(
            f"the prepared data at {cfg.prepared_uri} was made with other parameters: {', '.join(changed)}. "
            f"Nothing was changed. To keep it (runs trained on it resume only with it), prepare the new version "
            f"under another name (data.name={cfg.data.name}-2), or restore the original values; to re-encode it in "
            "place, run `voxrelay prepare --overwrite` (runs trained on the old data will then refuse to resume)"
        )
    log.warning("--overwrite: re-encoding %s (%s)", cfg.prepared_uri, ", ".join(changed))
    if rank == 0:
        storage.delete(storage.join(cfg.prepared_uri, sh.INDEX_FILE))
        if any(k.startswith(("codec.", "train.seed")) for k in changed):
            storage.delete(storage.join(cfg.prepared_uri, ident.CODEC_PARAMS_FILE))
            storage.delete(storage.join(cfg.prepared_uri, sh.CODEC_STATE_FILE))


def prepare(cfg: RunConfig, strict: bool = False, overwrite: bool = False) -> PrepareReport:
    """Run prepare for this process's share of the shards; rank 0 also writes the index.
    ``overwrite``: re-encode a committed dataset made with other parameters (else an error)."""
    rank, world = rank_world()
    prepared = cfg.prepared_uri
    storage.check_root(cfg.root)
    try:
        rows = collect_rows(cfg)
    except SourcesGone as gone:  # a later session of a notebook: the data is in the bucket, the raw files not
        return committed_without_sources(cfg, gone, rank)
    _check_usable(rows, cfg, strict, rank)
    check_codec_type(cfg)  # before a codec is loaded (or downloaded) for nothing
    codec = build_codec(cfg.codec)
    if hasattr(codec, "to") and torch.cuda.is_available():  # a neural codec encodes on the GPU when there is one
        codec.to(f"cuda:{int(os.environ.get('LOCAL_RANK', 0)) % torch.cuda.device_count()}")  # its process's own
    needs = family_needs(cfg, codec)
    check_params(cfg, codec, overwrite, rank)
    params = ident.shard_params(cfg, codec, _load_codec(cfg, codec, rows, rank), needs.fields)
    if needs.max_seconds is not None:  # which rows are kept depends on it (model.max_length)
        params["data.max_seconds"] = needs.max_seconds
    if needs.conversations and any(u.conversation for u in rows):  # the rows then say which turn they are
        params["data.conversations"] = True
    if needs.voice_prompts and any(u.voice_prompts for u in rows):  # the rows then hold their prompts' codes
        params["data.voice_prompts"] = True
    elif needs.voice_prompts and rank == 0 and not any(u.speaker for u in rows if u.problem is None):
        log.warning("no row has a `voice_prompts` column or names its voices (a `speaker` column): model.family="
                    "%s will train without voice prompts, and learn to clone voices from none. Give each row a "
                    "`voice_prompts` column (one clip per speaker, in the order of its labels; see docs/models.md), "
                    "before renting a GPU", cfg.model.family)
    plan = plan_shards(rows, cfg.data.eval_size, cfg.data.shard_size)
    try:
        skipped, written = _encode_shards(cfg, codec, plan, params, needs, strict, rank, world)
    except StrictStop as stop:
        rj.write(prepared, [stop.reject])
        raise
    if rank != 0:
        return PrepareReport(prepared, {}, 0.0, [], skipped, written)
    for name in plan:
        _wait_for(sh.marker_uri(prepared, name), f"shard {name} from another process")
    index, rejects = _write_index(cfg, codec, plan, params)
    advice = needs.advice(index) if needs.advice is not None else None
    if advice:
        log.warning("%s", advice)
    return PrepareReport(prepared, index["counts"], index["hours"], rejects, skipped, written)


def _encode_shards(cfg: RunConfig, codec: AudioCodec, plan: dict[str, list[Utterance]], params: dict,
                   needs: DataNeeds, strict: bool, rank: int, world: int) -> tuple[int, int]:
    """Encode and commit this process's shards (a shard committed with the same rows and parameters is
    reused) -> (shards reused, shards written)."""
    prepared = cfg.prepared_uri
    written = skipped = 0
    for i, (name, utts) in enumerate(plan.items()):
        if i % world != rank:
            continue
        ids_sha = hashlib.sha1("\n".join(u.id for u in utts).encode()).hexdigest()
        if _committed(prepared, name, ids_sha, params):
            skipped += 1  # committed by an earlier (killed) run
            continue
        good, rejects = encode_shard(utts, codec, cfg, strict, keep_audio=name.startswith("eval"),
                                     needs=needs)
        table = sh.encode_table(good)
        storage.write_bytes(sh.shard_uri(prepared, name), table)
        marker = {
            "sha256": hashlib.sha256(table).hexdigest(),  # what a node's cached copy is checked against
            "rows": len(good),
            "rejects": rejects,
            "seconds": sum(g.duration for g in good),
            "speakers": sorted({g.speaker for g in good if g.speaker}),
            "ids_sha1": ids_sha,
            "params": params,
            "rows_meta": rowindex.row_meta(good),  # the row index's columns (rows-<split>.parquet)
        }
        storage.write_json(sh.marker_uri(prepared, name), marker)  # the shard's commit
        written += 1
        log.info("shard %s: %d rows, %d rejected", name, len(good), len(rejects))
    return skipped, written


def load_prepared_codec(prepared_uri: str, index: dict | None = None) -> AudioCodec:
    index = index or load_index(prepared_uri)
    state = None
    if index.get("codec_state"):
        state = storage.read_bytes(storage.join(prepared_uri, index["codec_state"]))
    return codec_from_description(index["codec"], state)
