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
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from voxrelay import storage
from voxrelay.codecs.base import AudioCodec, FittableCodec
from voxrelay.codecs.registry import build_codec, codec_from_description
from voxrelay.config import RunConfig
from voxrelay.data import shards as sh
from voxrelay.data.audio import load_utterance_audio
from voxrelay.data.shards import PrepareError, load_index
from voxrelay.data.sources import read_source
from voxrelay.data.types import RowError, Utterance
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


def _load_codec(cfg: RunConfig, rows: list[Utterance], rank: int) -> AudioCodec:
    """Build the codec; a fittable one is fitted once (rank 0) and its state shared via storage."""
    codec = build_codec(cfg.codec)
    if not isinstance(codec, FittableCodec):
        return codec
    state_uri = storage.join(cfg.prepared_uri, sh.CODEC_STATE_FILE)
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
    _wait_for(state_uri, "the codec fitted by rank 0")
    codec.load_state_bytes(storage.read_bytes(state_uri))
    return codec


def _wait_for(uri: str, what: str, timeout: float = WAIT_TIMEOUT_S) -> None:
    deadline = time.time() + timeout
    while not storage.exists(uri):
        if time.time() > deadline:
            raise PrepareError(f"waited {timeout:.0f}s for {what} ({uri}); did another process die?")
        time.sleep(1.0)


def encode_shard(utts: list[Utterance], codec: AudioCodec, cfg: RunConfig, strict: bool, keep_audio: bool):
    """Validate + encode a shard's rows -> (encoded rows, rejects); ``keep_audio`` stores the
    reference recording too (eval split: MCD-DTW is scored against it)."""
    good, rejects = [], []
    for utt in utts:
        if utt.problem is not None:
            rejects.append(_reject(utt, utt.problem, strict))
            continue
        try:
            wav = load_utterance_audio(utt, codec.sample_rate, cfg.data.min_duration, cfg.data.max_duration)
        except RowError as err:
            rejects.append(_reject(utt, str(err), strict))
            continue
        codes = np.asarray(codec.encode(wav))
        if codes.ndim != 2 or codes.shape[0] != codec.num_codebooks or codes.shape[1] == 0:
            rejects.append(_reject(utt, f"codec returned codes of shape {codes.shape}", strict))
            continue
        good.append(
            sh.EncodedUtterance(
                id=utt.id,
                text=utt.text,
                speaker=utt.speaker,
                description=utt.description,
                duration=len(wav) / codec.sample_rate,
                codes=codes.astype(np.int16),
                ref_audio=wav if keep_audio else None,
            )
        )
    return good, rejects


def _write_index(cfg: RunConfig, codec: AudioCodec, plan: dict[str, list[Utterance]]):
    """Merge the shard markers into rejects.jsonl and write index.json (the commit marker) last."""
    prepared = cfg.prepared_uri
    shard_infos, rejects, counts, seconds, speakers = [], [], Counter(), 0.0, set()
    for name in plan:
        marker = storage.read_json(sh.marker_uri(prepared, name))
        rejects += marker["rejects"]
        split = name.split("-")[0]
        counts[split] += marker["rows"]
        seconds += marker["seconds"]
        speakers.update(marker["speakers"])
        shard_infos.append({"name": name, "split": split, "rows": marker["rows"], "seconds": marker["seconds"]})
    storage.write_text(storage.join(prepared, sh.REJECTS_FILE), "".join(json.dumps(r) + "\n" for r in rejects))
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
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    storage.write_json(storage.join(prepared, sh.INDEX_FILE), index)
    return index, rejects


def _committed(prepared: str, name: str, ids_sha: str) -> bool:
    """A shard is reused only if its marker exists and it holds the same rows (sources unchanged)."""
    uri = sh.marker_uri(prepared, name)
    if not storage.exists(uri):
        return False
    if storage.read_json(uri).get("ids_sha1") != ids_sha:
        log.warning("shard %s was prepared from other rows (sources changed); preparing it again", name)
        return False
    return True


def prepare(cfg: RunConfig, strict: bool = False) -> PrepareReport:
    """Run prepare for this process's share of the shards; rank 0 also writes the index."""
    rank, world = rank_world()
    prepared = cfg.prepared_uri
    rows = collect_rows(cfg)
    if not any(u.problem is None for u in rows):
        raise PrepareError("the sources yielded no usable rows; check data.sources paths (see rejects above)")
    codec = _load_codec(cfg, rows, rank)
    plan = plan_shards(rows, cfg.data.eval_size, cfg.data.shard_size)
    written = skipped = 0
    for i, (name, utts) in enumerate(plan.items()):
        if i % world != rank:
            continue
        ids_sha = hashlib.sha1("\n".join(u.id for u in utts).encode()).hexdigest()
        if _committed(prepared, name, ids_sha):
            skipped += 1  # committed by an earlier (killed) run
            continue
        good, rejects = encode_shard(utts, codec, cfg, strict, keep_audio=name.startswith("eval"))
        storage.write_bytes(sh.shard_uri(prepared, name), sh.encode_table(good))
        marker = {
            "rows": len(good),
            "rejects": rejects,
            "seconds": sum(g.duration for g in good),
            "speakers": sorted({g.speaker for g in good if g.speaker}),
            "ids_sha1": ids_sha,
        }
        storage.write_json(sh.marker_uri(prepared, name), marker)  # the shard's commit
        written += 1
        log.info("shard %s: %d rows, %d rejected", name, len(good), len(rejects))
    if rank != 0:
        return PrepareReport(prepared, {}, 0.0, [], skipped, written)
    for name in plan:
        _wait_for(sh.marker_uri(prepared, name), f"shard {name} from another process")
    index, rejects = _write_index(cfg, codec, plan)
    return PrepareReport(prepared, index["counts"], index["hours"], rejects, skipped, written)


def load_prepared_codec(prepared_uri: str, index: dict | None = None) -> AudioCodec:
    index = index or load_index(prepared_uri)
    state = None
    if index.get("codec_state"):
        state = storage.read_bytes(storage.join(prepared_uri, index["codec_state"]))
    return codec_from_description(index["codec"], state)
