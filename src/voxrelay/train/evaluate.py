"""Evaluation on the held-out split: loss, plus synthesis of a few held-out texts scored against
their reference recordings with MCD-DTW (dB, lower is better), intelligibility (Whisper WER/CER)
and speaker similarity (:mod:`voxrelay.quality`), so a user sees offline whether the model is
learning to speak. Samples and their transcripts go to TensorBoard and ``<run>/samples/step-N/``.
"""

from __future__ import annotations

import contextlib
import json

import numpy as np
import soundfile as sf

from voxrelay.quality.samples import generate_samples, held_out_loss
from voxrelay.train.state import rng_state, seed_generators, set_rng_state

SAMPLES_DIR = "samples"
SCORES_FILE = "scores.jsonl"  # per sample of an eval: id, text, transcript, wer, cer, speaker_sim


def eval_loss(run) -> dict[str, float]:
    return held_out_loss(run.model, run.module, run.eval_rows, run.accelerator.device, run.accelerator.autocast)


def synthesize_eval(run, step: int) -> dict[str, float]:
    """Generate ``train.eval_synth`` held-out texts; MCD-DTW vs the reference recordings, then
    (rank 0) WER/CER and speaker similarity."""
    ec = run.cfg.eval
    samples, results = generate_samples(run.model, run.codec, run.eval_rows[: run.cfg.train.eval_synth], step * 1000,
                                        temperature=ec.temperature, top_k=ec.top_k, top_p=ec.top_p,
                                        repetition_penalty=ec.repetition_penalty)
    if not samples or not run.accelerator.is_main_process:
        return results
    for i, sample in enumerate(samples):
        run.monitor.log_audio(step, f"eval/sample_{i}", sample.wav, sample.sample_rate)
        _save_wav(run, step, sample.id, sample.wav, sample.sample_rate)
    if run.scorer is not None:
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


@contextlib.contextmanager
def _eval_generators(model, seed: int):
    """The family's generators seeded alike for every eval (comparable losses from one eval to the next),
    and given back their training states afterwards: an eval must not change what training draws next (a
    resumed run, which evaluates at other steps, would diverge)."""
    gens = model.generators()
    saved = {name: g.get_state() for name, g in gens.items()}
    seed_generators(gens, seed, rank=-1)
    try:
        yield
    finally:
        for name, g in gens.items():
            g.set_state(saved[name])


@contextlib.contextmanager
def _training_rng():
    """Give training back its RNG state (python, numpy, torch and this GPU's) once an eval is done: an eval
    that draws from it — the speaker encoder's layers are initialised when it loads at the first eval of a
    session — would make a resumed run diverge from a straight one."""
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)


def evaluate(run, step: int) -> dict[str, float]:
    with _training_rng(), _eval_generators(run.model, run.cfg.train.seed), run.model.eval_weights():
        return _evaluate(run, step)


def _evaluate(run, step: int) -> dict[str, float]:
    results = eval_loss(run)
    # sharded weights: every rank takes part in each forward, so every rank generates (the same codes)
    if run.accelerator.is_main_process or run.sharded:
        results |= synthesize_eval(run, step)
    run.accelerator.wait_for_everyone()
    return results
