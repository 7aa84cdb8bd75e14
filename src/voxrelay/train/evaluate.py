"""Evaluation on the held-out split: loss, plus synthesis of a few held-out texts scored against
their reference recordings with MCD-DTW (dB, lower is better), intelligibility (Whisper WER/CER)
and speaker similarity (:mod:`voxrelay.quality`), so a user sees offline whether the model is
learning to speak. Samples and their transcripts go to TensorBoard and ``<run>/samples/step-N/``.
"""

from __future__ import annotations

import json

import numpy as np
import soundfile as sf
import torch

from voxrelay.metrics import mcd_dtw
from voxrelay.models.base import LOSS_TOKENS
from voxrelay.quality.scorer import Sample

SAMPLES_DIR = "samples"
SCORES_FILE = "scores.jsonl"  # per sample of an eval: id, text, transcript, wer, cer, speaker_sim


@torch.no_grad()
def eval_loss(run) -> dict[str, float]:
    """``eval/loss`` (mean over the loss targets of every held-out row) and, for a family whose loss
    has parts (e.g. per codebook), ``eval/loss/<part>`` on the same scale."""
    rows = run.eval_rows
    if not rows:
        return {"eval/loss": float("nan")}
    module, model = run.module, run.model
    was_training = module.training
    module.eval()
    total, count, parts = 0.0, 0, {}
    for i in range(0, len(rows), 8):
        batch = model.collate([model.example(r) for r in rows[i : i + 8]])
        batch.pop(LOSS_TOKENS)  # the loss returns its own count
        batch = {k: v.to(run.accelerator.device) for k, v in batch.items()}
        with run.accelerator.autocast():
            out = model.loss(module, batch)
        total += float(out.loss_sum)
        count += int(out.num_tokens)
        for name, value in out.parts.items():
            parts[name] = parts.get(name, 0.0) + float(value)
    module.train(was_training)
    n = max(count, 1)
    return {"eval/loss": total / n} | {f"eval/loss/{name}": value / n for name, value in parts.items()}


def synthesize_eval(run, step: int) -> dict[str, float]:
    """Generate ``train.eval_synth`` held-out texts; MCD-DTW vs the reference recordings, then
    (rank 0) WER/CER and speaker similarity."""
    codec, model = run.codec, run.model
    mcds, stopped, ratios, samples = [], 0, [], []
    for i, row in enumerate(run.eval_rows[: run.cfg.train.eval_synth]):
        ref_frames = row.codes.shape[1]
        max_frames = 2 * ref_frames + 20
        codes = model.generate(row.text, speaker=row.speaker, max_frames=max_frames, seed=step * 1000 + i)
        frames = codes.shape[1]
        stopped += int(frames < max_frames)
        ratios.append(frames / ref_frames)
        wav = codec.decode(codes) if frames else np.zeros(1, dtype=np.float32)
        ref = row.ref_audio if row.ref_audio is not None else codec.decode(row.codes)
        mcds.append(mcd_dtw(ref, wav, codec.sample_rate))
        samples.append(Sample(row.id, row.text, wav, codec.sample_rate, ref, codec.sample_rate))
        if run.accelerator.is_main_process:
            run.monitor.log_audio(step, f"eval/sample_{i}", wav, codec.sample_rate)
            _save_wav(run, step, row.id, wav, codec.sample_rate)
    if not mcds:
        return {}
    results = {
        "eval/mcd_dtw": float(np.mean(mcds)),
        "eval/stopped_frac": stopped / len(mcds),
        "eval/length_ratio": float(np.mean(ratios)),
    }
    if run.accelerator.is_main_process and run.scorer is not None:
        scores, rows = run.scorer.score(samples)
        results |= scores
        _log_scores(run, step, rows)
    return results


def _log_scores(run, step: int, rows: list[dict]) -> None:
    """Per sample: the transcript (TensorBoard text) and its scores in ``samples/step-N/scores.jsonl``."""
    for i, row in enumerate(rows):
        if "transcript" in row:
            run.monitor.log_text(step, f"eval/sample_{i}", f"text: {row['text']}  \nheard: {row['transcript']}")
    path = run.local_dir / SAMPLES_DIR / f"step-{step:08d}" / SCORES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _save_wav(run, step: int, utt_id: str, wav: np.ndarray, sample_rate: int) -> None:
    """Into the local run folder: the run folder itself for a local root; for a remote one the monitor
    copies it there in the background (an unreachable bucket must not stop training)."""
    path = run.local_dir / SAMPLES_DIR / f"step-{step:08d}" / f"{utt_id}.wav"
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, wav, sample_rate, format="WAV", subtype="PCM_16")


def evaluate(run, step: int) -> dict[str, float]:
    results = eval_loss(run)
    # sharded weights: every rank takes part in each forward, so every rank generates (the same codes)
    if run.accelerator.is_main_process or run.sharded:
        results |= synthesize_eval(run, step)
    run.accelerator.wait_for_everyone()
    return results
