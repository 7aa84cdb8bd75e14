"""Validate and encode the rows of one shard: the family's checks, the audio (decoded, bounded, resampled), the
codec's codes; a bad row becomes a reject ``{"id", "where", "reason"}`` (with ``--strict``: :class:`StrictStop`)."""

from __future__ import annotations

import numpy as np

from voxrelay.codecs.base import AudioCodec
from voxrelay.config import RunConfig
from voxrelay.data import shards as sh
from voxrelay.data.audio import load_utterance_audio
from voxrelay.data.needs import missing_field
from voxrelay.data.shards import PrepareError
from voxrelay.data.types import RowError, Utterance
from voxrelay.data.voice_prompts import encode_prompts
from voxrelay.models.base import DataNeeds


class StrictStop(PrepareError):
    """``--strict`` met a bad row (``reject``)."""

    def __init__(self, reject: dict):
        super().__init__(f"{reject['where']} (id {reject['id']!r}): {reject['reason']} (run without --strict to "
                         "skip bad rows)")
        self.reject = reject


def _reject(utt: Utterance, reason: str, strict: bool) -> dict:
    reject = {"id": utt.id, "where": utt.where, "reason": reason}
    if strict:
        raise StrictStop(reject)
    return reject


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
                duration=len(wav) / codec.sample_rate, codes=sh.stored_array(codes, codec),
                ref_audio=wav if keep_audio and not getattr(codec, "continuous", False) else None,
                voice_prompts=prompts.get(id(utt), ()),
                conversation=utt.conversation if needs.conversations else None,
                turn=utt.turn if needs.conversations else None))
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
