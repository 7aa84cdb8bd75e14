"""Evaluation on the held-out split: loss, plus synthesis of a few held-out texts scored against
their reference recordings with MCD-DTW (dB, lower is better), intelligibility (Whisper WER/CER)
and speaker similarity (:mod:`voxrelay.quality`), so a user sees offline whether the model is
learning to speak. Samples and their transcripts go to TensorBoard and ``<run>/samples/step-N/``.

The eval itself is :func:`voxrelay.quality.evaluation.evaluate_model`, the one ``voxrelay eval`` runs too: the
same weights, seeds and texts give the same numbers. Each part is guarded on its own, here the sinks and the
samples folder too: what was computed is logged and reaches early stopping and keep_best.
"""

from __future__ import annotations

import json

import numpy as np
import soundfile as sf

from voxrelay.errors import one_line
from voxrelay.quality.evaluation import EvalParts, EvalResult, evaluate_model
from voxrelay.quality.samples import held_out_loss

SAMPLES_DIR = "samples"
SCORES_FILE = "scores.jsonl"  # per sample of an eval: id, text, seconds, transcript, wer, cer, speaker_sim


def eval_loss(run) -> dict[str, float]:
    """The held-out loss of the run's model as it is now (no eval context: the caller's weights and RNG)."""
    return held_out_loss(run.model, run.module, run.eval_rows, run.accelerator.device, run.accelerator.autocast)


class EvalFailed(RuntimeError):
    """The eval failed outside its guarded parts on some rank; raised on every rank alike (the loop logs it)."""


def evaluate(run, step: int) -> dict[str, float]:
    """The eval of ``step``: the loss on every rank; samples on rank 0 (on every rank with sharded weights: each
    forward needs them all), scored, logged and saved by rank 0. Returns what was measured, with
    ``eval/failed_parts`` when a part failed. Every rank reaches the agreement at the end, whatever failed on it
    (Whisper running out of GPU memory on rank 0 alone, a full disk): an error outside the guarded parts is
    caught, gathered, and raised as :class:`EvalFailed` on every rank, never a barrier one rank skips."""
    acc, tc = run.accelerator, run.cfg.train
    parts, error = EvalParts(step, progress=run.lease.progress if run.lease is not None else lambda: None), None
    speaks = acc.is_main_process or run.sharded
    try:
        result = evaluate_model(run.model, run.codec, run.eval_rows,
                                run.eval_rows[: tc.eval_synth] if speaks else [], step, tc.seed, run.cfg.eval,
                                run.scorer if acc.is_main_process else None, parts, module=run.module,
                                device=acc.device, autocast=acc.autocast)
        if acc.is_main_process:
            _publish(run, step, result, parts)
    except Exception as err:  # noqa: BLE001 (agreed on below: every rank learns it, none is left waiting)
        error = f"{type(err).__name__}: {one_line(err)[:300]}"
    failed = [(rank, why) for rank, why in enumerate(run.ranks.gather(error)) if why]  # in place of a barrier
    if failed:
        raise EvalFailed(f"on rank {failed[0][0]}: {failed[0][1]}")
    return result.metrics | parts.metrics()


def _publish(run, step: int, result: EvalResult, parts: EvalParts) -> None:
    """The samples to every sink (each on its own) and into ``samples/step-N/`` with their scores."""
    for sink in run.monitor.sinks:
        with parts.part(f"{type(sink).__name__} audio"):
            for i, sample in enumerate(result.samples):
                sink.log_audio(step, f"eval/sample_{i}", sample.wav, sample.sample_rate)
        heard = [(i, row) for i, row in enumerate(result.scores) if "transcript" in row]
        with parts.part(f"{type(sink).__name__} transcripts"):
            for i, row in heard:
                sink.log_text(step, f"eval/sample_{i}", f"text: {row['text']}  \nheard: {row['transcript']}")
    with parts.part("the samples folder"):
        for sample in result.samples:
            _save_wav(run, step, sample.id, sample.wav, sample.sample_rate)
        if result.scores:
            path = run.local_dir / SAMPLES_DIR / f"step-{step:08d}" / SCORES_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(row) + "\n" for row in result.scores))


def _save_wav(run, step: int, utt_id: str, wav: np.ndarray, sample_rate: int) -> None:
    """Into the local run folder: the run folder itself for a local root; for a remote one the monitor
    copies it there in the background (an unreachable bucket must not stop training)."""
    path = run.local_dir / SAMPLES_DIR / f"step-{step:08d}" / f"{utt_id}.wav"
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, wav, sample_rate, format="WAV", subtype="PCM_16")

