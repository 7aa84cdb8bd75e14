"""``eval.png`` (a run's) and a sweep's ``eval.png`` are titled with what their scores were measured with."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from voxrelay.quality import plot
from voxrelay.sweep import report
from voxrelay.sweep import state as st
from voxrelay.sweep.spec import Experiment

pytest.importorskip("matplotlib")
ASR = ("Whisper base (packaged) (faster-whisper, beam 5), language en, Whisper's English normaliser without its "
       "spelling map")
MOS = "UTMOS22 strong (utmos22_strong_step7459_v1.pt)"


@pytest.fixture
def titles(monkeypatch) -> list[str]:
    """The suptitle of every figure saved (instead of writing it)."""
    seen: list[str] = []

    def keep(fig, target: str) -> str:
        seen.append(fig._suptitle.get_text() if fig._suptitle else "")
        return target

    monkeypatch.setattr(plot, "save_figure", keep)
    monkeypatch.setattr(report, "save_figure", keep)
    return seen


def _metrics(run, records: list[dict]) -> None:
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_runs_plot_names_the_asr_and_the_mos_model_of_its_newest_scores(tmp_path, titles):
    _metrics(tmp_path / "run", [{"step": 2, "eval/loss": 5.0, "eval/wer": 0.9, "eval/asr": "an older ASR"},
                                {"step": 4, "eval/loss": 4.0, "eval/wer": 0.6, "eval/asr": ASR,
                                 "eval/utmos": 2.1, "eval/mos_model": MOS}])
    plot.write_plot(str(tmp_path / "run"))
    assert titles == [f"WER/CER by {ASR}; UTMOS by {MOS}"]


def test_a_sweeps_plot_names_the_asr_of_its_experiments(tmp_path, titles, monkeypatch):
    states = []
    for name, lr in (("a", 1e-3), ("b", 2e-3)):
        _metrics(tmp_path / name, [{"step": 4, "eval/loss": 4.0, "eval/wer": 0.6, "eval/asr": ASR}])
        states.append(st.ExperimentState(Experiment(name, {"train.lr": lr}), str(tmp_path / name), st.FINISHED, 4, 4))
    monkeypatch.setattr(st, "states", lambda root, sweep: states)
    sweep = SimpleNamespace(name="lr")
    report.write_plot(str(tmp_path), sweep, report.rows(str(tmp_path), sweep))
    assert titles == [f"WER/CER by {ASR}"]
