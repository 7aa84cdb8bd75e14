"""``sweep status``'s table says what its WERs were measured with: once when every experiment used one ASR, per
ASR naming the experiments when they differ (WERs measured differently are not comparable)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from voxrelay.sweep import report
from voxrelay.sweep import state as st
from voxrelay.sweep.spec import Experiment

BASE = "whisper base.en (greedy, temperature 0) with Whisper's English normaliser"
LARGE = "faster-whisper large-v3 (beam 5) with Whisper's English normaliser"


def _experiment(tmp_path, name: str, lr: float, records: list[dict]) -> st.ExperimentState:
    run = tmp_path / "runs" / name
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return st.ExperimentState(Experiment(name, {"train.lr": lr}), str(run), st.FINISHED, 4, 4)


def _table(tmp_path, monkeypatch, states: list[st.ExperimentState]) -> str:
    monkeypatch.setattr(st, "states", lambda root, sweep: states)
    return report.table(report.rows(str(tmp_path), SimpleNamespace(name="lr")))


def test_one_asr_for_every_experiment_is_said_once(tmp_path, monkeypatch):
    states = [_experiment(tmp_path, "a", 1e-3, [{"step": 2, "eval/wer": 0.9, "eval/asr": BASE},
                                                 {"step": 4, "eval/wer": 0.5, "eval/asr": BASE}]),
              _experiment(tmp_path, "b", 2e-3, [{"step": 4, "eval/wer": 0.7, "eval/asr": BASE}])]
    text = _table(tmp_path, monkeypatch, states)
    assert text.splitlines()[-1] == f"WER/CER by {BASE}" and text.count("WER/CER by") == 1
    assert "0.500 @4" in text and "0.700 @4" in text


def test_experiments_scored_by_different_asrs_are_named_with_theirs(tmp_path, monkeypatch):
    states = [_experiment(tmp_path, "a", 1e-3, [{"step": 4, "eval/wer": 0.5, "eval/asr": BASE}]),
              _experiment(tmp_path, "b", 2e-3, [{"step": 2, "eval/wer": 0.4, "eval/asr": BASE},
                                                 {"step": 4, "eval/wer": 0.3, "eval/asr": LARGE}]),
              _experiment(tmp_path, "c", 3e-3, [{"step": 4, "eval/loss": 5.0}])]  # trained without WER
    lines = _table(tmp_path, monkeypatch, states).splitlines()
    assert lines[-2:] == [f"WER/CER by {BASE} (a)", f"WER/CER by {LARGE} (b)"]  # b's newest ASR


def test_the_best_run_is_the_lowest_eval_loss_with_a_committed_checkpoint(tmp_path, monkeypatch):
    states = [_experiment(tmp_path, "a", 1e-3, [{"step": 4, "eval/loss": 5.0}]),
              _experiment(tmp_path, "b", 2e-3, [{"step": 2, "eval/loss": 4.0}, {"step": 4, "eval/loss": 4.5}]),
              _experiment(tmp_path, "c", 3e-3, [{"step": 2, "eval/loss": 3.0}])]
    states[2].durable_step = None  # its lowest loss, but nothing committed to speak from yet
    monkeypatch.setattr(st, "states", lambda root, sweep: states)
    found = report.rows(str(tmp_path), SimpleNamespace(name="lr"))
    assert report.best_run(found) == (states[1].run_uri, "the lowest eval loss, 4.000 at step 2")
    assert report.best_run(found[2:]) is None
    states[0].durable_step = None
    unscored = report.rows(str(tmp_path), SimpleNamespace(name="lr"))
    for r in unscored:
        r.curves = {}  # trained without evals
    assert report.best_run(unscored) == (states[1].run_uri, "no eval loss to rank by: the first with a checkpoint")
