"""``voxrelay prepare --check-codec``: does the configured codec reproduce *your* audio (your language, your
voices, your recording conditions) before anyone trains on its codes?

A sample of the sources' clips (``--clips``, picked by the hash of their ids: the same ones each time) is encoded and
decoded by ``codec.*``; each round trip is compared with its recording by MCD-DTW (dB, :mod:`voxrelay.quality.mcd`)
and, when ``eval.asr`` is set (Whisper; ``eval.asr.language`` the language of the data), by the word and character
error rates of the recording's and the round trip's transcripts against the text. The recordings' own WER is the
yardstick: what the round trip adds to it is what the codec loses. A fittable codec (the built-in one) is fitted on
the sample first (``prepare`` fits it on up to 1,500 clips).

Nothing is prepared. The report (``report.json``) and each clip's round trip (``<id>.wav``, to listen to) are
written to ``<root>/prepared/<data.name>/codec_check/``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from dataclasses import dataclass, field

import numpy as np

from voxrelay import storage
from voxrelay.codecs.base import FittableCodec
from voxrelay.codecs.registry import build_codec
from voxrelay.config import RunConfig
from voxrelay.data.audio import load_utterance_audio
from voxrelay.data.needs import check_codec_type, family_needs
from voxrelay.data.shards import PrepareError
from voxrelay.data.types import RowError
from voxrelay.quality.mcd import mcd_dtw

log = logging.getLogger(__name__)
CHECK_DIR = "codec_check"


@dataclass
class CodecCheck:
    """Per clip (``clips``: id, seconds, mcd_db, and with an ASR wer/cer of the recording and of the round trip)
    and for the sample (``summary``); ``skipped``: clips whose audio could not be read, with the reason."""

    codec: dict
    clips: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    skipped: list[dict] = field(default_factory=list)
    uri: str = ""


def pick(rows: list, n: int) -> list:
    """``n`` usable rows, by the hash of their ids (stable whatever the order and number of rows)."""
    usable = [u for u in rows if u.problem is None]
    return sorted(usable, key=lambda u: hashlib.sha1(u.id.encode()).hexdigest())[:n]


def check_codec(cfg: RunConfig, clips: int = 16) -> CodecCheck:
    from voxrelay.data.prepare import collect_rows

    check_codec_type(cfg)
    every = collect_rows(cfg)
    rows = pick(every, clips)
    if not rows:
        raise PrepareError("the sources hold no usable row to check the codec on; check data.sources")
    codec = build_codec(cfg.codec)
    family_needs(cfg, codec)
    wavs, texts, kept, report = [], [], [], CodecCheck(codec.describe())
    for utt in rows:
        try:
            wavs.append(load_utterance_audio(utt, codec.sample_rate, cfg.data.min_duration, cfg.data.max_duration))
            texts.append(utt.text)
            kept.append(utt)
        except RowError as err:
            report.skipped.append({"id": utt.id, "where": utt.where, "reason": str(err)})
    if not kept:
        raise PrepareError(f"none of the {len(rows)} clips picked could be read ({report.skipped[0]['reason']}); "
                           "check data.sources")
    if isinstance(codec, FittableCodec):  # fitted as prepare would fit it
        _fit(cfg, codec, every)
    trips = [np.asarray(codec.decode(codec.encode(w)), dtype=np.float32) for w in wavs]
    rate = codec.sample_rate  # what encode takes and decode gives (NeuCodec resamples inside)
    for utt, wav, trip in zip(kept, wavs, trips, strict=True):
        report.clips.append({"id": utt.id, "seconds": round(len(wav) / rate, 3),
                             "mcd_db": round(mcd_dtw(wav, trip, rate), 3)})
    report.summary = {"clips": len(kept), "mcd_db": round(float(np.mean([c["mcd_db"] for c in report.clips])), 3)}
    if cfg.eval.asr is not None:
        report.summary |= _intelligibility(cfg, report.clips, texts, [(w, rate) for w in wavs],
                                           [(t, rate) for t in trips])
    report.uri = storage.join(cfg.prepared_uri, CHECK_DIR)
    _save(report, kept, trips, rate)
    return report


def _fit(cfg: RunConfig, codec: FittableCodec, rows: list) -> None:
    from voxrelay.data.prepare import fit_sample

    sample, _, _ = fit_sample(cfg, codec, rows)
    try:
        codec.fit(sample, seed=cfg.train.seed)
    except ValueError as err:
        raise PrepareError(f"the codec cannot be fitted on these sources as prepare would fit it: {err}") from err


def _intelligibility(cfg: RunConfig, clips: list[dict], texts: list[str], recordings: list, trips: list) -> dict:
    """WER/CER of the recordings' and the round trips' transcripts (one Whisper, ``eval.asr``); empty when the ASR
    cannot be loaded (the reason is logged)."""
    from voxrelay.quality.asr import AsrMissing, AsrModelError, Transcriber
    from voxrelay.quality.text import errors

    asr = cfg.eval.asr
    try:
        whisper = Transcriber.load(asr.model, asr.device, 0, asr.beam_size, asr.batch_size)
    except (AsrMissing, AsrModelError, RuntimeError) as err:
        log.warning("codec check: WER/CER not measured: %s", err)
        return {}
    out = {"asr_model": whisper.name, "language": asr.language, "asr": whisper.describe(asr.language)}
    for kind, audio in (("recording", recordings), ("round_trip", trips)):
        hyps = whisper.transcribe(audio, asr.language)
        total = None
        for clip, text, hyp in zip(clips, texts, hyps, strict=True):
            e = errors(text, hyp, asr.language)
            total = e if total is None else total + e
            clip |= {f"{kind}_wer": round(e.wer, 4), f"{kind}_cer": round(e.cer, 4), f"{kind}_transcript": hyp}
        out |= {f"{kind}_wer": round(total.wer, 4), f"{kind}_cer": round(total.cer, 4)}
    return out


def _save(report: CodecCheck, kept: list, trips: list, rate: int) -> None:
    import soundfile as sf

    for utt, trip in zip(kept, trips, strict=True):
        buf = io.BytesIO()
        sf.write(buf, trip, rate, format="WAV", subtype="PCM_16")
        storage.write_bytes(storage.join(report.uri, f"{_safe(utt.id)}.wav"), buf.getvalue())
    body = {"codec": report.codec, "summary": report.summary, "clips": report.clips, "skipped": report.skipped}
    storage.write_bytes(storage.join(report.uri, "report.json"), json.dumps(body, indent=2).encode())


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:120] or "clip"


def text_coverage(cfg: RunConfig) -> tuple[list | None, int]:
    """(the family's :meth:`~voxrelay.models.seam.FamilyConfig.text_coverage` of every usable transcript of the
    sources, how many non-space characters they hold)."""
    from voxrelay.data.prepare import collect_rows

    texts = [u.text for u in collect_rows(cfg) if u.problem is None and u.text]
    return cfg.model.text_coverage(texts), sum(1 for t in texts for c in t if not c.isspace())

