"""``voxrelay prepare``: sources -> validated utterances -> codec codes -> Parquet shards + index.json.

Every row is validated; a bad row is rejected with its reason (``rejects.jsonl`` + a summary) or,
with ``strict``, stops the run at the first one. Shards are committed one by one (a ``.done``
marker after the Parquet file), so a killed prepare re-run skips what is committed. Several
processes (torchrun/accelerate: RANK, WORLD_SIZE) split the shards; rank 0 fits the codec first
and writes ``index.json`` last, once every shard is committed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from voxrelay import storage
from voxrelay.codecs.base import AudioCodec, FittableCodec
from voxrelay.codecs.registry import build_codec, codec_from_description
from voxrelay.config import RunConfig
from voxrelay.data import identity as ident
from voxrelay.data import rowindex
from voxrelay.data import shards as sh
from voxrelay.data.audio import load_utterance_audio
from voxrelay.data.needs import family_needs, missing_field
from voxrelay.data.shards import PrepareError, load_index
from voxrelay.data.sources import read_source
from voxrelay.data.types import RowError, Utterance
from voxrelay.data.voice_prompts import encode_prompts
from voxrelay.models.base import DataNeeds
from voxrelay.paths import cache_dir, rank_world

log = logging.getLogger(__name__)
FIT_CLIPS = 1500
WAIT_TIMEOUT_S = 6 * 3600


@dataclass
class PrepareReport:
    prepared_uri: str
    counts: dict[str, int]
    hours: float
    rejects: list[dict] = field(default_factory=list)
    skipped_shards: int = 0
    written_shards: int = 0


def collect_rows(cfg: RunConfig) -> list[Utterance]:
    """All source rows in a stable order; a duplicate id gets its ``problem`` set like any bad row,
    so every reject is reported in one place (the shard that holds it)."""
    rows, seen = [], {}
    workdir = str(cache_dir("sources"))
    for src in cfg.data.sources:
        for utt in read_source(src, workdir):
            if utt.problem is None and utt.id in seen:
                utt.problem = f"duplicate id {utt.id!r} (first seen at {seen[utt.id]}); ids must be unique"
            seen.setdefault(utt.id, utt.where)
            rows.append(utt)
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


def _reject(utt: Utterance, reason: str, strict: bool) -> dict:
    if strict:
        raise PrepareError(f"{utt.where} (id {utt.id!r}): {reason} (run without --strict to skip bad rows)")
    return {"id": utt.id, "where": utt.where, "reason": reason}


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
        rng = np.random.default_rng(cfg.train.seed)
        pick = rng.permutation(len(rows))[:FIT_CLIPS]
        wavs = []
        for i in sorted(pick):
            if rows[i].problem is not None:
                continue
            try:
                wavs.append(
                    load_utterance_audio(rows[i], codec.sample_rate, cfg.data.min_duration, cfg.data.max_duration)
                )
            except RowError:
                continue  # rejected (with its reason) when its shard is encoded
        if not wavs:
            raise PrepareError("no usable audio to fit the codec on: every row was rejected (see above)")
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


def encode_shard(utts: list[Utterance], codec: AudioCodec, cfg: RunConfig, strict: bool, keep_audio: bool,
                 needs: DataNeeds = DataNeeds()):
    """Validate + encode a shard's rows -> (encoded rows, rejects); ``keep_audio`` stores the
    reference recording too (eval split: MCD-DTW is scored against it); ``needs``: the family's (text fields
    every row must have, its check of a row). Rows are read a few batches at a time (bounded memory); with
    ``codec.batch_size`` > 1 a codec that can encodes clips of similar length together."""
    good, rejects, prompts, clips = [], [], {}, {}  # clips: prompt path -> codes (rows share a few prompts)
    chunk = 8 * cfg.codec.batch_size
    for start in range(0, len(utts), chunk):
        loaded = []
        for utt in utts[start : start + chunk]:
            if utt.problem is None:
                utt.problem = missing_field(utt, cfg, needs.fields)
            if utt.problem is None and needs.row_check is not None:
                prompts_given = (len(utt.voice_prompts),) if needs.voice_prompts else ()
                utt.problem = needs.row_check(utt.text, utt.num_speakers, utt.speaker, *prompts_given)
            if utt.problem is not None:
                rejects.append(_reject(utt, utt.problem, strict))
                continue
            try:
                wav = load_utterance_audio(utt, codec.sample_rate, cfg.data.min_duration, cfg.data.max_duration)
                if needs.voice_prompts:  # kept with the row (prepared data needs no access to the source later)
                    prompts[id(utt)] = encode_prompts(utt, codec, cfg.data.max_duration, clips)
                loaded.append((utt, wav))
            except RowError as err:
                rejects.append(_reject(utt, str(err), strict))
        if needs.max_seconds is not None:
            long = [(u, w) for u, w in loaded if len(w) / codec.sample_rate > needs.max_seconds]
            rejects += [_reject(u, f"audio of {len(w) / codec.sample_rate:.1f} s is too long: {needs.max_seconds_why}",
                                strict) for u, w in long]
            loaded = [(u, w) for u, w in loaded if len(w) / codec.sample_rate <= needs.max_seconds]
        for (utt, wav), codes in zip(loaded, _encode_all([w for _, w in loaded], codec, cfg), strict=True):
            codes = np.asarray(codes)
            if codes.ndim != 2 or codes.shape[0] != codec.num_codebooks or codes.shape[1] == 0:
                rejects.append(_reject(utt, f"codec returned codes of shape {codes.shape}", strict))
                continue
            good.append(sh.EncodedUtterance(
                id=utt.id, text=utt.text, speaker=utt.speaker, description=utt.description,
                duration=len(wav) / codec.sample_rate, codes=codes.astype(np.int16),
                ref_audio=wav if keep_audio and not getattr(codec, "continuous", False) else None,
                voice_prompts=prompts.get(id(utt), ())))
    return good, rejects


def _encode_all(wavs: list[np.ndarray], codec: AudioCodec, cfg: RunConfig) -> list[np.ndarray]:
    """Codes of every clip, in order: one at a time, or in batches of ``codec.batch_size`` clips of similar
    length (sorted, so little of a batch is padding)."""
    size = cfg.codec.batch_size
    if size <= 1 or not hasattr(codec, "encode_batch"):
        return [codec.encode(w) for w in wavs]
    order = sorted(range(len(wavs)), key=lambda i: len(wavs[i]))
    out: list = [None] * len(wavs)
    for start in range(0, len(order), size):
        group = order[start : start + size]
        for i, codes in zip(group, codec.encode_batch([wavs[i] for i in group]), strict=True):
            out[i] = codes
    return out


def _write_index(cfg: RunConfig, codec: AudioCodec, plan: dict[str, list[Utterance]], params: dict):
    """Merge the shard markers into rejects.jsonl and write index.json (the commit marker) last;
    files whose content would not change are left as they are."""
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
        shard_infos.append({"name": name, "split": split, "rows": marker["rows"], "seconds": marker["seconds"]})
        metas.setdefault(split, []).append(marker.get("rows_meta") or rowindex.meta_of_shard(prepared, name))
    rejects_uri, text = storage.join(prepared, sh.REJECTS_FILE), "".join(json.dumps(r) + "\n" for r in rejects)
    if not storage.exists(rejects_uri) or storage.read_text(rejects_uri) != text:
        storage.write_text(rejects_uri, text)
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
        log.warning("shard %s was prepared from other rows (sources changed); preparing it again", name)
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
    rows = collect_rows(cfg)
    if not any(u.problem is None for u in rows):
        raise PrepareError("the sources yielded no usable rows; check data.sources paths (see rejects above)")
    codec = build_codec(cfg.codec)
    if hasattr(codec, "to") and torch.cuda.is_available():
        codec.to("cuda")  # a neural codec encodes on the GPU when there is one (prepare only, not at training)
    needs = family_needs(cfg, codec)
    check_params(cfg, codec, overwrite, rank)
    params = ident.shard_params(cfg, codec, _load_codec(cfg, codec, rows, rank), needs.fields)
    if needs.max_seconds is not None:  # which rows are kept depends on it (model.max_length)
        params["data.max_seconds"] = needs.max_seconds
    if needs.voice_prompts and any(u.voice_prompts for u in rows):  # the rows then hold their prompts' codes
        params["data.voice_prompts"] = True
    plan = plan_shards(rows, cfg.data.eval_size, cfg.data.shard_size)
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
        storage.write_bytes(sh.shard_uri(prepared, name), sh.encode_table(good))
        marker = {
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
    if rank != 0:
        return PrepareReport(prepared, {}, 0.0, [], skipped, written)
    for name in plan:
        _wait_for(sh.marker_uri(prepared, name), f"shard {name} from another process")
    index, rejects = _write_index(cfg, codec, plan, params)
    return PrepareReport(prepared, index["counts"], index["hours"], rejects, skipped, written)


def format_rejects(rejects: list[dict], prepared_uri: str, limit: int = 30) -> list[str]:
    """A header and one ``file:row id: reason`` line per reject (the first ``limit``), file paths
    relative to the folder the sources share."""
    where = [re.match(r"^(.*) (?:row|line) (\d+)$", r["where"]) for r in rejects]
    files = [m.group(1) for m in where if m and os.path.isabs(m.group(1))]
    base = os.path.commonpath(files) if files else ""
    base = os.path.dirname(base) if base in files else base  # one file: relative to its folder
    lines = [f"{len(rejects)} rejected rows (all in {storage.join(prepared_uri, sh.REJECTS_FILE)})"
             + (f"; paths relative to {base}:" if base else ":")]
    for r, m in zip(rejects[:limit], where, strict=False):
        place = r["where"]
        if m:
            path = os.path.relpath(m.group(1), base) if base and os.path.isabs(m.group(1)) else m.group(1)
            place = f"{path}:{m.group(2)}"
        lines.append(f"  {place} {r['id']}: {r['reason']}")
    if len(rejects) > limit:
        lines.append(f"  ... and {len(rejects) - limit} more")
    return lines


def load_prepared_codec(prepared_uri: str, index: dict | None = None) -> AudioCodec:
    index = index or load_index(prepared_uri)
    state = None
    if index.get("codec_state"):
        state = storage.read_bytes(storage.join(prepared_uri, index["codec_state"]))
    return codec_from_description(index["codec"], state)
