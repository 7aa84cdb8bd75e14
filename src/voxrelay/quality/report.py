"""``voxrelay eval``: the evaluation of training, on demand, for any checkpoint of a run or an export.

For each step asked for: held-out loss, MCD-DTW, WER/CER and speaker similarity of the run's
held-out texts (or of ``--texts``, then WER/CER only), by training's own eval
(:func:`~voxrelay.quality.evaluation.evaluate_model`: the weights it evaluates with, its seeds, the same texts),
so ``--step N --num <train.eval_synth>`` gives the numbers training logged at step N. Results go to
``<run>/eval/results.jsonl`` and ``<run>/eval/step-N/`` (wavs, scores.jsonl), and the curves of
every eval so far to ``<run>/eval.png``.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import soundfile as sf

from voxrelay import storage
from voxrelay.errors import UserError
from voxrelay.paths import check_path
from voxrelay.quality.config import EvalConfig
from voxrelay.quality.samples import TextRow
from voxrelay.quality.scorer import Scorer, said_by

EVAL_DIR = "eval"
RESULTS_FILE = "results.jsonl"
COLUMNS = ("eval/loss", "eval/text_gain", "eval/wer", "eval/cer", "eval/silent_frac", "eval/mcd_dtw",
           "eval/speaker_sim")
OPTIONAL_COLUMNS = ("eval/utmos",)  # shown when a row has them (eval.utmos is off by default)


class EvalError(UserError, ValueError):
    """What to evaluate is missing or unreadable; the message names the file and the fix."""


def read_texts(path: Path) -> list[TextRow]:
    """``--texts``: a text file, one text per line (``speaker|text`` picks a voice; blank lines and # comments
    skipped), or a ``.jsonl`` file, one object per line with ``text`` and optional ``speaker``, ``description``
    (and ``id``)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise EvalError(f"--texts {path}: cannot read it ({e}); pass a UTF-8 text file, one text per line") from None
    rows = _jsonl_texts(path, lines) if path.suffix == ".jsonl" else _plain_texts(path, lines)
    if not rows:
        raise EvalError(f"--texts {path}: no texts in it; write one text per line")
    return rows


def _plain_texts(path: Path, lines: list[str]) -> list[TextRow]:
    rows = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        speaker, _, text = line.rpartition("|")
        if not text.strip():
            raise EvalError(f"--texts {path} line {n}: no text after '|'; write `text` or `speaker|text`")
        rows.append(TextRow(f"text-{n:04d}", text.strip(), speaker.strip() or None))
    return rows


def _jsonl_texts(path: Path, lines: list[str]) -> list[TextRow]:
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise EvalError(f"--texts {path} line {n}: not JSON ({e.msg}); write one object per line, "
                            '{"text": ..., "speaker": ..., "description": ...}') from None
        text = obj.get("text") if isinstance(obj, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise EvalError(f"--texts {path} line {n}: no \"text\" string; each line needs one")
        unknown = sorted(set(obj) - {"id", "text", "speaker", "description"})
        if unknown:
            raise EvalError(f"--texts {path} line {n}: unknown field(s) {', '.join(unknown)}; the fields are id, "
                            "text, speaker, description")
        fields = {k: obj.get(k) for k in ("speaker", "description")}
        bad = [k for k, v in fields.items() if v is not None and not isinstance(v, str)]
        if bad:
            raise EvalError(f"--texts {path} line {n}: {', '.join(bad)} must be a string")
        rows.append(TextRow(str(obj.get("id") or f"text-{n:04d}"), text.strip(), fields["speaker"] or None,
                            description=fields["description"] or None))
    return rows


def held_out_rows(cfg, model) -> list:
    """The run's held-out rows as training evaluates them: its eval split (sorted by id), too long ones left out."""
    from voxrelay.data.prepare import load_index
    from voxrelay.train.data import eval_split

    return [r for r in eval_split(cfg, load_index(cfg.prepared_uri)) if model.length(r) <= model.max_length]


def evaluate_step(model, codec, rows: list, step: int, scorer: Scorer, loss_rows: list | None = None,
                  seed: int = 0) -> tuple[dict[str, float], list, list[dict]]:
    """(metrics, samples, per-sample scores) of ``model`` at ``step`` speaking ``rows``; the held-out loss over
    ``loss_rows``; the eval of training itself (:func:`~voxrelay.quality.evaluation.evaluate_model`: the same
    context, ``seed`` its ``train.seed``), so a checkpoint gives the numbers training logged at its step."""
    import torch

    from voxrelay.quality.evaluation import EvalParts, evaluate_model

    given = [r for r in rows if isinstance(r, TextRow) and r.description]
    if given and "description" not in model.request_fields:
        raise EvalError(f"text {given[0].id} has a description, but model.family={model.family} takes none; "
                        "leave the description fields out of --texts")
    parts = EvalParts(step, fatal=(UserError,))  # bad input stays exit 2, with its message
    result = evaluate_model(model, codec, loss_rows, rows, step, seed, scorer.cfg, scorer, parts,
                            device=torch.device("cpu"))
    return result.metrics | parts.metrics(), result.samples, result.scores


def save_step(run_uri: str, step: int, metrics: dict, samples: list, per_sample: list[dict], what: str) -> None:
    """``<run>/eval/step-N/`` (wavs + scores.jsonl) and a line of ``<run>/eval/results.jsonl``."""
    folder = storage.join(run_uri, EVAL_DIR, f"step-{step:08d}")
    with tempfile.TemporaryDirectory() as tmp:
        for s in samples:
            local = Path(tmp) / f"{s.id}.wav"
            sf.write(local, s.wav, s.sample_rate, format="WAV", subtype="PCM_16")
            storage.put_file(local, storage.join(folder, local.name))
    storage.write_text(storage.join(folder, "scores.jsonl"), "".join(json.dumps(r) + "\n" for r in per_sample))
    results = storage.join(run_uri, EVAL_DIR, RESULTS_FILE)
    old = storage.read_text(results) if storage.exists(results) else ""
    line = json.dumps({"step": step, "time": round(time.time(), 3), "texts": what, **metrics})
    storage.write_text(results, old + line + "\n")


def format_table(rows: list[tuple[int | str, dict]]) -> str:
    """One line per step: loss, WER, CER, MCD-DTW, speaker similarity, UTMOS when measured ('-' where not); then
    the lines naming what the WER/CER (and UTMOS) were measured with, when they were."""
    columns = COLUMNS + tuple(c for c in OPTIONAL_COLUMNS if any(c in m for _, m in rows))
    head = f"{'step':>8}  " + "  ".join(f"{c.split('/', 1)[1]:>11}" for c in columns)
    lines = [head]
    for step, m in rows:
        cells = [f"{m[c]:>11.3f}" if isinstance(m.get(c), float | int) else f"{'-':>11}" for c in columns]
        lines.append(f"{step!s:>8}  " + "  ".join(cells))
    return "\n".join(lines + list(dict.fromkeys(line for _, m in rows for line in said_by(m))))


def scorer_for(cfg, asr_model: str | None, utmos: str | None = None) -> Scorer:
    """The run's eval scorer (defaults for an export), with ``--asr-model`` and ``--utmos`` (``true``: the
    released weights) over its settings."""
    import torch

    eval_cfg = cfg.eval.model_copy(deep=True) if cfg is not None else EvalConfig()
    if asr_model is not None:
        eval_cfg.asr = (eval_cfg.asr or EvalConfig().asr).model_copy(update={"model": asr_model})
    if utmos is not None:
        eval_cfg.utmos = True if utmos.lower() == "true" else utmos
    return Scorer(eval_cfg, torch.get_num_threads())


def run_steps(run_uri: str, step: int | None, all_steps: bool) -> list[int | None]:
    """The checkpoint steps to evaluate: ``--step``, every checkpoint (``--all``), else the newest."""
    if not all_steps:
        return [step]
    from voxrelay.checkpoint.manager import CheckpointManager

    steps = sorted({c.step for c in CheckpointManager(run_uri, reader=True).candidates()})
    if not steps:
        raise EvalError(f"{run_uri} has no checkpoint yet; train first (voxrelay train CONFIG)")
    return steps


def evaluate_source(source: str, step: int | None = None, all_steps: bool = False, texts: Path | None = None,
                    asr_model: str | None = None, num: int | None = None, utmos: str | None = None,
                    progress=lambda msg: None) -> list[tuple[int | str, dict]]:
    """``voxrelay eval``: (step or 'export', metrics) per evaluated checkpoint; a run's results and
    plot are written into the run folder."""
    from voxrelay.inference import CODEC_JSON, load_from_export, load_from_run, run_config

    rows = read_texts(texts)[:num] if texts is not None else None
    what = f"--texts {texts}" if texts is not None else "held-out"
    if storage.is_local(source) and (Path(storage.local_path(source)) / CODEC_JSON).exists():
        if step is not None or all_steps:
            raise EvalError("--step/--all apply to run folders; an export folder holds one model")
        if rows is None:
            raise EvalError(f"{source} is an export folder, which holds no held-out data: pass --texts FILE")
        model, codec = load_from_export(storage.local_path(source))
        metrics, _, _ = evaluate_step(model, codec, rows, 0, scorer_for(None, asr_model, utmos))
        return [("export", metrics)]
    if storage.is_local(source):  # results go into the run folder: checked before minutes of scoring
        check_path(storage.local_path(source), "RUN", "copy the run folder to where you can write (eval writes "
                   f"{EVAL_DIR}/ and eval.png into it)", writes=True, folder=True)
    cfg = run_config(source)
    scorer = scorer_for(cfg, asr_model, utmos)
    out = []
    for wanted in run_steps(source, step, all_steps):
        model, codec, at = load_from_run(source, wanted)
        progress(f"evaluating {source} at step {at} ({what})")
        held_out = held_out_rows(cfg, model)
        metrics, samples, per_sample = evaluate_step(model, codec, rows or held_out[:num], at, scorer, held_out,
                                                     cfg.train.seed)
        save_step(source, at, metrics, samples, per_sample, what)
        out.append((at, metrics))
    from voxrelay.quality.plot import write_plot

    write_plot(source)
    return out
