"""The eval scorer: WER/CER and speaker similarity of a set of samples, and what it does when the
optional extra is not installed (says so once, scores the rest)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.speech import SENTENCES, espeak
from voxrelay.quality.config import EvalConfig
from voxrelay.quality.scorer import Sample, Scorer


def _samples(generated_voice: str, reverse: bool) -> list[Sample]:
    out = []
    for i, text in enumerate(SENTENCES[1:3] + SENTENCES[4:5]):  # no names Whisper spells otherwise
        wav, sr = espeak(text, generated_voice, rate=175)
        ref, ref_sr = espeak(text, "en-us", rate=150)  # the reference recording: another take, one voice
        out.append(Sample(f"u{i}", text, wav[::-1].copy() if reverse else wav, sr, ref, ref_sr))
    return out


@pytest.fixture(scope="module")
def scorer():
    return Scorer(EvalConfig(), threads=2)


def test_right_words_in_the_right_voice_score_better_on_every_metric(scorer):
    good, good_rows = scorer.score(_samples("en-us", reverse=False))
    bad, bad_rows = scorer.score(_samples("en-us+f3", reverse=True))
    assert set(good) == set(bad) == {"eval/wer", "eval/cer", "eval/speaker_sim"}
    print(f"good {good}; bad {bad}")
    assert good["eval/wer"] < 0.35 < 0.8 < bad["eval/wer"], (good_rows, bad_rows)
    assert good["eval/cer"] < bad["eval/cer"]
    assert good["eval/speaker_sim"] > 0.8 and good["eval/speaker_sim"] - bad["eval/speaker_sim"] > 0.15
    row = good_rows[0]
    assert row["id"] == "u0" and row["text"] == SENTENCES[1]
    assert "ladder" in row["transcript"].lower() and 0 <= row["wer"] < 0.5 and row["speaker_sim"] > 0.8


def test_speaker_similarity_does_not_depend_on_loudness(scorer):
    quiet = _samples("en-us", reverse=False)[:1]
    loud = [Sample(s.id, s.text, s.wav * 8, s.sample_rate, s.reference, s.reference_rate) for s in quiet]
    cfg = EvalConfig(asr=None)
    a, _ = Scorer(cfg).score(quiet)
    b, _ = Scorer(cfg).score(loud)
    assert set(a) == {"eval/speaker_sim"}
    assert a["eval/speaker_sim"] == pytest.approx(b["eval/speaker_sim"], abs=1e-3)


BLOCKED = """
import importlib.abc, json, logging, sys
import numpy as np

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("faster_whisper", "resemblyzer"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, Blocker())
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from voxrelay.quality.config import EvalConfig
from voxrelay.quality.scorer import Sample, Scorer
scorer = Scorer(EvalConfig())
wav = np.sin(np.arange(16000) / 5).astype(np.float32)
for _ in range(2):
    metrics, rows = scorer.score([Sample("a", "hello", wav, 16000, wav, 16000)])
    print(json.dumps([metrics, rows]))
"""


def test_without_the_extra_eval_says_once_how_to_enable_it_and_goes_on():
    res = subprocess.run([sys.executable, "-c", BLOCKED], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    outputs = [json.loads(line) for line in res.stdout.splitlines()]
    assert outputs == [[{}, [{"id": "a", "text": "hello", "seconds": 1.0}]]] * 2
    warnings = [line for line in res.stderr.splitlines() if "not measured" in line]
    assert len(warnings) == 2, res.stderr  # WER/CER once, speaker similarity once, for both evals
    assert all("pip install 'voxrelay[eval]'" in line for line in warnings), warnings
