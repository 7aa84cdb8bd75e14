"""Scores of generated speech besides MCD-DTW: intelligibility (WER/CER through Whisper),
speaker similarity (cosine of speaker embeddings vs the reference recording; for a multi-speaker sample,
per speaker against its voice: :func:`per_speaker`) and, when ``eval.utmos`` asks, UTMOS (predicted MOS).

WER/CER and speaker similarity need the optional extra ``voxrelay[eval]``; without it, or when a model cannot be
loaded, the first evaluation says so once and the others go on without that score.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import numpy as np

from voxrelay.errors import UserError
from voxrelay.quality.asr import AsrMissing, AsrModelError, Transcriber, resolve_device
from voxrelay.quality.config import EvalConfig
from voxrelay.quality.text import errors

log = logging.getLogger(__name__)
ASR_KEY = "eval/asr"  # beside eval/wer: the Whisper, its decoding and the normaliser they were measured with
MOS_KEY = "eval/mos_model"  # beside eval/utmos: the MOS predictor and its weights file
_WHAT = {"asr": "WER/CER", "speaker": "speaker similarity", "utmos": "UTMOS"}
YARDSTICKS = {ASR_KEY: "WER/CER", MOS_KEY: "UTMOS"}


def said_by(metrics: dict) -> list[str]:
    """What the scores of ``metrics`` were measured with, one line per yardstick ("WER/CER by ...")."""
    return [f"{what} by {metrics[key]}" for key, what in YARDSTICKS.items() if metrics.get(key)]


@dataclass
class Sample:
    """One generated utterance, its text and (when known) the reference recording of that text."""

    id: str
    text: str
    wav: np.ndarray
    sample_rate: int
    reference: np.ndarray | None = None
    reference_rate: int = 0
    voices: list[np.ndarray] | None = None  # a dialogue's voice per speaker (at sample_rate): per-speaker similarity


class Scorer:
    """Loads Whisper and the speaker encoder on first use (once per process)."""

    def __init__(self, cfg: EvalConfig, threads: int = 0):
        self.cfg = cfg
        self.threads = threads
        self._models: dict[str, object | None] = {}

    def _load(self, kind: str):
        if kind not in self._models:
            self._models[kind] = None
            try:
                if kind == "asr":
                    asr = self.cfg.asr
                    self._models[kind] = Transcriber.load(asr.model, asr.device, self.threads, asr.beam_size,
                                                          asr.batch_size)
                elif kind == "utmos":
                    from voxrelay.quality.utmos import UtmosScorer

                    self._models[kind] = UtmosScorer.load(self.cfg.utmos, resolve_device(
                        self.cfg.asr.device if self.cfg.asr is not None else "auto"))
                else:
                    from voxrelay.quality.speaker import SpeakerEncoder

                    self._models[kind] = SpeakerEncoder.load()
            except (AsrMissing, AsrModelError, RuntimeError, UserError) as err:
                log.warning("eval: %s not measured: %s", _WHAT[kind], err)
        return self._models[kind]

    def yardstick(self) -> str | None:
        """What every WER/CER of this scorer is measured with (the ASR model, its decoding, the text normaliser);
        None before Whisper is loaded or without one."""
        asr = self._models.get("asr")
        return asr.describe(self.cfg.asr.language) if asr is not None and self.cfg.asr is not None else None

    def score(self, samples: list[Sample], parts=None) -> tuple[dict[str, float], list[dict]]:
        """(set metrics ``eval/wer``, ``eval/cer``, ``eval/speaker_sim``, one row per sample). ``parts``: an
        :class:`~voxrelay.quality.evaluation.EvalParts` that runs WER/CER and speaker similarity each on its own
        (one failing leaves the other's scores); None: an error propagates. A sample with no audio (a model that
        stopped at once) is heard as nothing (WER 1) and has no speaker similarity."""
        rows = [{"id": s.id, "text": s.text, "seconds": round(len(s.wav) / s.sample_rate, 3)} for s in samples]
        metrics: dict[str, float] = {}
        if not samples:
            return metrics, rows
        guard = parts.part if parts is not None else (lambda name: contextlib.nullcontext())
        asr = self._load("asr") if self.cfg.asr is not None else None
        if asr is not None:
            with guard("WER/CER"):
                metrics |= _intelligibility(asr, self.cfg.asr.language, rows, samples)
        encoder = self._load("speaker") if self.cfg.speaker_similarity else None
        if encoder is not None:
            with guard("speaker similarity"):
                metrics |= _similarities(encoder, rows, samples)
        utmos = self._load("utmos") if self.cfg.utmos else None
        if utmos is not None:
            with guard("UTMOS"):
                metrics |= _naturalness(utmos, rows, samples)
        return metrics, rows


def _intelligibility(asr, language: str | None, rows: list[dict], samples: list[Sample]) -> dict[str, float]:
    """``eval/wer`` and ``eval/cer`` of the set (edits over the reference words of every sample); each row gets its
    transcript and scores."""
    hyps = asr.transcribe([(s.wav, s.sample_rate) for s in samples], language)  # an empty sample is heard as ""
    total, language = None, language or "en"
    yardstick = asr.describe(language)
    for row, sample, hyp in zip(rows, samples, hyps, strict=True):
        e = errors(sample.text, hyp, language)
        total = e if total is None else total + e
        row |= {"transcript": hyp, "wer": round(e.wer, 4), "cer": round(e.cer, 4), "asr": yardstick}
    return {"eval/wer": total.wer, "eval/cer": total.cer}


def _naturalness(utmos, rows: list[dict], samples: list[Sample]) -> dict:
    """``eval/utmos``: the mean predicted MOS of the samples with audio, and what predicted it (``eval/mos_model``);
    each row gets its own ``utmos``."""
    found = []
    for row, s in zip(rows, samples, strict=True):
        if len(s.wav):
            found.append(utmos.score(s.wav, s.sample_rate))
            row["utmos"] = round(found[-1], 4)
    return {"eval/utmos": float(np.mean(found)), MOS_KEY: utmos.describe()} if found else {}


def _similarities(encoder, rows: list[dict], samples: list[Sample]) -> dict[str, float]:
    """``eval/speaker_sim`` (and per speaker ``eval/speaker_sim/<i>`` for samples with several voices): the mean
    over samples of the cosine to the reference recording, or of the per-speaker similarities."""
    from voxrelay.quality.speaker import cosine

    sims: list[float] = []
    by_speaker: dict[int, list[float]] = {}
    for row, s in zip(rows, samples, strict=True):
        if not len(s.wav):
            continue  # no audio, no voice to compare (empty_frac and length_ratio say it)
        if s.voices:
            found = per_speaker(encoder, s.wav, s.sample_rate, s.voices)
            for i, sim in found.items():
                row[f"speaker_sim/{i}"] = round(sim, 4)
                by_speaker.setdefault(i, []).append(sim)
            sims += list(found.values())
        elif s.reference is not None:
            sim = cosine(encoder.embed(_level(s.wav), s.sample_rate),
                         encoder.embed(_level(s.reference), s.reference_rate))
            row["speaker_sim"] = round(sim, 4)
            sims.append(sim)
    metrics = {f"eval/speaker_sim/{i}": float(np.mean(v)) for i, v in sorted(by_speaker.items())}
    return metrics | ({"eval/speaker_sim": float(np.mean(sims))} if sims else {})


def per_speaker(encoder, wav: np.ndarray, rate: int, voices: list[np.ndarray], window: float = 1.6) -> dict[int, float]:
    """Speaker similarity of a multi-speaker ``wav`` per speaker: the audio cut into ``window``-second pieces
    (half overlapping), each piece given to the voice it is most like; speaker i's score is the mean cosine of
    its pieces to its voice (a speaker no piece sounds like gets its best piece's cosine: a low score)."""
    from voxrelay.quality.speaker import cosine

    refs = [encoder.embed(_level(v), rate) for v in voices]
    size = min(len(wav), max(1, int(window * rate)))
    starts = range(0, max(1, len(wav) - size + 1), max(1, size // 2))
    pieces = [encoder.embed(_level(wav[a:a + size]), rate) for a in starts]
    cos = np.array([[cosine(p, r) for r in refs] for p in pieces])  # [pieces, speakers]
    owner = cos.argmax(axis=1)
    return {i: float(cos[owner == i, i].mean()) if (owner == i).any() else float(cos[:, i].max())
            for i in range(len(refs))}


def _level(wav: np.ndarray, dbfs: float = -30.0) -> np.ndarray:
    """``wav`` scaled to an RMS of ``dbfs``: the encoder's embedding moves with loudness above -30 dBFS
    (it only ever raises the level), and a sample must not score by how loud it is."""
    wav = np.asarray(wav, dtype=np.float32)
    rms = float(np.sqrt(np.mean(wav.astype(np.float64) ** 2))) if wav.size else 0.0
    return wav if rms < 1e-6 else wav * np.float32(10 ** (dbfs / 20) / rms)
