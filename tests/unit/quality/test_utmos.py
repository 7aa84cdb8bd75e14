"""UTMOS (eval.utmos): voxrelay's model gives SpeechMOS' own module's scores on the same weights, loads the
weights file as SpeechMOS releases it (a torch.save'd state dict in SpeechMOS' names), refuses other files with the
fix, and reaches the eval's metrics, rows and table."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.utmos_weights import stand_in_weights, waves
from voxrelay.quality.config import EvalConfig
from voxrelay.quality.report import format_table
from voxrelay.quality.scorer import Sample, Scorer
from voxrelay.quality.utmos import UtmosScorer, UtmosWeightsError

UPSTREAM = json.loads((Path(__file__).parents[2] / "fixtures/utmos/upstream.json").read_text())


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> Path:
    """The stand-in weights saved as SpeechMOS' release is: torch.save of the upstream module's state dict."""
    path = tmp_path_factory.mktemp("utmos") / "utmos22_strong_step7459_v1.pt"
    torch.save(stand_in_weights(UPSTREAM["shapes"]), path)
    return path


@pytest.fixture(scope="module")
def utmos(weights_file) -> UtmosScorer:
    return UtmosScorer.load(str(weights_file))


def test_scores_equal_speechmos_own_module_on_the_same_weights(utmos):
    ours = [utmos.score(w, 16_000) for w in waves()]
    # bit-equal here; 2e-5 leaves room for other CPUs' float order (the tanh GELU instead of the exact one: 7e-4)
    assert ours == pytest.approx(UPSTREAM["scores"], abs=2e-5), (ours, UPSTREAM["scores"])
    assert abs(ours[0] - ours[1]) > 0.1  # two clips, two scores: the check can tell them apart


def test_a_clip_at_another_rate_is_resampled_to_16_khz(utmos):
    clip = waves()[0]
    import soxr

    at_24k = soxr.resample(clip, 16_000, 24_000, quality="HQ").astype(np.float32)
    assert utmos.score(at_24k, 24_000) == pytest.approx(utmos.score(clip, 16_000), abs=0.05)


def test_a_file_of_other_weights_is_refused_naming_it_and_the_fix(tmp_path):
    other = tmp_path / "other.pt"
    torch.save({"encoder.weight": torch.zeros(3, 3)}, other)
    with pytest.raises(UtmosWeightsError, match=r"other\.pt is not UTMOS22 strong's state dict.*utmos22_strong"):
        UtmosScorer.load(str(other))
    with pytest.raises(UtmosWeightsError, match=r"missing\.pt is not a file.*true to download"):
        UtmosScorer.load(str(tmp_path / "missing.pt"))


def test_a_pickle_that_runs_code_is_refused(tmp_path):
    class Payload:
        def __reduce__(self):
            return (print, ("code ran",))

    bad = tmp_path / "evil.pt"
    torch.save({"x": Payload()}, bad)
    with pytest.raises(UtmosWeightsError, match="not plain tensors"):
        UtmosScorer.load(str(bad))


def test_eval_reports_utmos_with_what_measured_it(weights_file):
    clips = waves()
    samples = [Sample(f"u{i}", "hello", w, 16_000) for i, w in enumerate(clips)] + [Sample("e", "x", clips[0][:0],
                                                                                           16_000)]
    cfg = EvalConfig(asr=None, speaker_similarity=False, utmos=str(weights_file))
    metrics, rows = Scorer(cfg).score(samples)
    assert metrics["eval/utmos"] == pytest.approx(np.mean(UPSTREAM["scores"]), abs=2e-4)
    assert metrics["eval/mos_model"] == "UTMOS22 strong (utmos22_strong_step7459_v1.pt)"
    assert [r.get("utmos") for r in rows] == [pytest.approx(s, abs=2e-4) for s in UPSTREAM["scores"]] + [None]
    table = format_table([(100, metrics)])
    assert table.splitlines()[0].split()[-1] == "utmos" and "UTMOS by UTMOS22 strong" in table
    assert "utmos" not in format_table([(100, {"eval/loss": 1.0})])  # off by default: no column


def test_unreadable_weights_leave_the_other_scores_and_say_why(tmp_path, caplog):
    cfg = EvalConfig(asr=None, speaker_similarity=False, utmos=str(tmp_path / "nowhere.pt"))
    with caplog.at_level(logging.WARNING):
        metrics, rows = Scorer(cfg).score([Sample("a", "hi", waves()[0], 16_000)])
    assert metrics == {} and rows[0] == {"id": "a", "text": "hi", "seconds": 1.3}
    assert "UTMOS not measured: eval.utmos:" in caplog.text and "nowhere.pt is not a file" in caplog.text
