"""Speech generated for scoring, shared by the evaluation during training and ``voxrelay eval``:
the held-out loss, and generated samples with MCD-DTW against their reference recordings."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from voxrelay.models.base import pop_counts, request_for, sampling_options, weighted_mean
from voxrelay.quality.mcd import mcd_dtw, silent_fraction
from voxrelay.quality.scorer import Sample


@dataclass
class TextRow:
    """A text to speak without a reference recording (``voxrelay eval --texts``)."""

    id: str
    text: str
    speaker: str | None = None
    codes: np.ndarray | None = None
    description: str | None = None
    ref_audio: np.ndarray | None = None


@torch.no_grad()
def held_out_loss(model, module, rows: list, device, autocast=contextlib.nullcontext,
                  progress: Callable[[], object] = lambda: None) -> dict[str, float]:
    """``eval/loss``, the objective over every row (each loss term's mean over its targets, weighted as in
    training), and each term's mean as ``eval/loss/<term>``.

    With two rows or more, also ``eval/text_gain``: how much the text helps predict the audio, in the
    objective's units. It is the loss of each row read with the next row's text (audio, speaker and
    description kept) minus its loss with its own text. Near 0, the model speaks without reading the
    text (fluent babble); it grows as the model learns to read, often before WER moves.
    """
    if not rows:
        return {"eval/loss": float("nan")}
    was_training = module.training
    module.eval()
    try:
        own = _summed_loss(model, module, rows, device, autocast, progress)
        pairs = _with_other_texts(model, rows)
        if pairs:  # every row usually pairs: then its own-text loss is the one just computed
            paired = own if len(pairs) == len(rows) else _summed_loss(
                model, module, [row for row, _ in pairs], device, autocast, progress)
            other = _summed_loss(model, module, [swapped for _, swapped in pairs], device, autocast, progress)
    finally:
        module.train(was_training)
    sums, counts, _ = own
    out = {"eval/loss": weighted_mean(*own)} | {f"eval/loss/{name}": sums[name] / max(counts[name], 1)
                                                 for name in sums}
    if pairs:
        out["eval/text_gain"] = weighted_mean(*other) - weighted_mean(*paired)
    return out


def _summed_loss(model, module, rows: list, device, autocast, progress) -> tuple[dict[str, float], dict[str, int],
                                                                         dict[str, float]]:
    """Each loss term's sum and target count over ``rows`` (8 at a time), and its weight."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    weights: dict[str, float] = {}
    for i in range(0, len(rows), 8):
        batch = model.collate([model.example(r) for r in rows[i : i + 8]])
        pop_counts(batch)  # the loss returns its own counts
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast():
            terms = model.loss(module, batch)
        for name, term in terms.items():
            sums[name] = sums.get(name, 0.0) + float(term.sum)
            counts[name] = counts.get(name, 0) + int(term.count)
            weights[name] = term.weight
        progress()
    return sums, counts, weights


def _with_other_texts(model, rows: list) -> list[tuple]:
    """(row, the row with the next row's text) for each row that has a different text and still fits
    ``model.max_length`` with it."""
    pairs = []
    for i, row in enumerate(rows):
        text = rows[(i + 1) % len(rows)].text
        if text != row.text:
            swapped = dataclasses.replace(row, text=text)
            if model.length(swapped) <= model.max_length:
                pairs.append((row, swapped))
    return pairs


def _ref_frames(model, codec, row) -> int:
    """How many frames ``model`` would generate for ``row``'s recording: its codes' count, or for a family
    with its own frame rate the row's duration at that rate."""
    rate = model.frame_rate  # a family with its own latents; None: the codec's frames
    return int(row.codes.shape[1]) if rate is None else max(1, round(row.duration * rate))


def generate_samples(model, codec, rows: list, seed_base: int, max_seconds: float = 20.0,
                     speaker: str | None = None, temperature: float = 0.8,
                     top_k: int | None = 50, progress: Callable[[], object] = lambda: None,
                     **options: float | None) -> tuple[list[Sample], dict[str, float]]:
    """Speak each row's text (seed ``seed_base + i``; a row with codes may run to twice its length +
    20 frames, one without to ``max_seconds``): ``eval/silent_frac`` (the share of the generated audio that is
    silence: a run that learned to generate silence shows it before anything else), ``eval/stopped_frac`` (the
    share that ended by itself before its limit) and ``eval/empty_frac`` (the share with no audio at all: a model
    that stops at once); with references also ``eval/length_ratio`` and ``eval/mcd_dtw``. ``options``: top_p,
    repetition_penalty (None: the family's). ``progress``: called after each sample.

    A sample with no audio is a finding, not an error: its wav is empty (0 samples), it counts as silence and as
    stopped, its length ratio is 0, and it is left out of the MCD mean (no distance to nothing: the old 1-sample
    stand-in scored *better* than speech)."""
    samples, mcds, ratios, silent, stopped, empty = [], [], [], [], 0, 0
    for i, row in enumerate(rows):
        has_ref = row.codes is not None
        ref_frames = _ref_frames(model, codec, row) if has_ref else 0
        max_frames = 2 * ref_frames + 20 if has_ref else int(max_seconds * (model.frame_rate or codec.frame_rate))
        prompts = tuple(model.stored_prompt(codec, np.asarray(p)) for p in getattr(row, "voice_prompts", None) or ())
        request = request_for(model, row.text, row.speaker or speaker, row.description, prompts)
        speech = model.speak(request, codec, max_frames=max_frames, seed=seed_base + i, temperature=temperature,
                             top_k=top_k, **sampling_options(model, **options))
        voices = model.voice_references(request)
        frames = speech.frames
        wav = np.asarray(speech.wav, dtype=np.float32) if frames else np.zeros(0, dtype=np.float32)
        silent.append(silent_fraction(wav, speech.sample_rate))  # 1.0 for no audio
        stopped += int(frames < max_frames)
        empty += int(wav.size == 0)
        ref = None
        if has_ref:
            ratios.append(frames / max(ref_frames, 1))
            ref = row.ref_audio if row.ref_audio is not None else codec.decode(row.codes)
            if wav.size:
                mcds.append(mcd_dtw(ref, wav, codec.sample_rate))
        spoken = model.spoken_text(row.text)
        samples.append(Sample(row.id, spoken, wav, speech.sample_rate, ref, codec.sample_rate,
                              voices if voices and len(voices) > 1 else None))
        progress()
    if not rows:
        return samples, {}
    out = {"eval/silent_frac": float(np.mean(silent)), "eval/stopped_frac": stopped / len(rows),
           "eval/empty_frac": empty / len(rows)}
    if mcds:
        out["eval/mcd_dtw"] = float(np.mean(mcds))
    if ratios:
        out["eval/length_ratio"] = float(np.mean(ratios))
    return samples, out
