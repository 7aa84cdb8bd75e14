"""Speech scores as a user meets them: every eval of `voxrelay train` logs WER/CER and speaker
similarity (metrics, TensorBoard text, samples/step-N/scores.jsonl); `voxrelay eval` scores any
checkpoint the same way (same seeds: the same transcripts as training's eval at that step), a table
for --all, the plot <run>/eval.png, --texts on an export; bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.runner import CONFIG, env_for, voxrelay
from tests.integration.tiny import tiny

# the demo's phoneme input end to end (train, checkpoint, eval, export, eval of the export)
SCORED = ("eval.asr={}", "eval.speaker_similarity=true", "train.eval_synth=2", "eval.temperature=0.5",
          "model.tokenizer=phonemes")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    base = tmp_path_factory.mktemp("eval")
    env = env_for(base / "cache")
    for cmd in ("prepare", "train"):
        res = voxrelay(cmd, CONFIG, *tiny(str(base / "root"), *SCORED), env=env)
        assert res.returncode == 0, res.stdout + res.stderr
    return base, env, base / "root" / "runs" / "demo"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_training_eval_logs_wer_cer_and_speaker_similarity(trained):
    _, _, run = trained
    evals = [m for m in _jsonl(run / "metrics.jsonl") if "eval/loss" in m]
    assert [m["step"] for m in evals] == [0, 3, 6]
    for m in evals:
        assert {"eval/wer", "eval/cer", "eval/speaker_sim", "eval/mcd_dtw", "eval/text_gain"} <= set(m), m
    rows = _jsonl(run / "samples" / "step-00000006" / "scores.jsonl")
    assert len(rows) == 2 and all({"id", "text", "transcript", "wer", "cer", "speaker_sim"} <= set(r) for r in rows)
    # the step's figures are those of its samples: edits over reference words of the set, the mean similarity
    from voxrelay.quality.text import errors, set_errors

    total = set_errors([r["text"] for r in rows], [r["transcript"] for r in rows])
    assert (evals[-1]["eval/wer"], evals[-1]["eval/cer"]) == pytest.approx((total.wer, total.cer))
    assert [r["wer"] for r in rows] == [round(errors(r["text"], r["transcript"]).wer, 4) for r in rows]
    assert evals[-1]["eval/speaker_sim"] == pytest.approx(sum(r["speaker_sim"] for r in rows) / 2, abs=1e-4)
    assert all((run / "samples" / "step-00000006" / f"{r['id']}.wav").is_file() for r in rows)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard")).Reload()
    text_tags = events.Tags()["tensors"]
    assert "eval/sample_0/text_summary" in text_tags, text_tags
    heard = events.Tensors("eval/sample_0/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert heard.startswith(f"text: {rows[0]['text']}") and f"heard: {rows[0]['transcript']}" in heard


def test_eval_of_a_checkpoint_reproduces_trainings_eval_at_that_step(trained):
    _, env, run = trained
    # training spoke the first 2 held-out texts (train.eval_synth) with these seeds: --num 2
    res = voxrelay("eval", str(run), "--step", "6", "--num", "2", "--json", env=env)
    assert res.returncode == 0, res.stderr
    (result,) = [json.loads(line) for line in res.stdout.splitlines()]
    training = next(m for m in _jsonl(run / "metrics.jsonl") if m["step"] == 6 and "eval/loss" in m)
    assert result["step"] == 6 and set(result) - {"step"} == set(training) - {"step", "time"}
    for key, value in training.items():
        if key.startswith("eval/"):
            assert result[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    on_demand = _jsonl(run / "eval" / "step-00000006" / "scores.jsonl")
    assert on_demand == _jsonl(run / "samples" / "step-00000006" / "scores.jsonl")
    # by default every held-out text (3 here)
    res = voxrelay("eval", str(run), "--step", "6", env=env)
    assert res.returncode == 0, res.stderr
    assert len(_jsonl(run / "eval" / "step-00000006" / "scores.jsonl")) == 3


def test_eval_all_prints_a_table_per_checkpoint_and_writes_the_plot(trained):
    _, env, run = trained
    res = voxrelay("eval", str(run), "--all", env=env)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[0].split() == ["step", "loss", "text_gain", "wer", "cer", "silent_frac", "mcd_dtw", "speaker_sim"]
    assert [line.split()[0] for line in lines[1:]] == ["4", "6"]  # the checkpoints kept (keep_last 2)
    assert all(len(line.split()) == 8 and "-" not in line.split()[1:] for line in lines[1:])
    steps = [r["step"] for r in _jsonl(run / "eval" / "results.jsonl")]
    assert steps[-2:] == [4, 6]
    assert (run / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_of_an_export_speaks_the_given_texts(trained, tmp_path):
    _, env, run = trained
    res = voxrelay("export", str(run), "-o", str(tmp_path / "export"), env=env)
    assert res.returncode == 0, res.stderr
    texts = tmp_path / "texts.txt"
    texts.write_text("# a comment\nThe kettle was broken.\n\nen-us|Did Felix carry the ladder?\n")
    res = voxrelay("eval", str(tmp_path / "export"), "--texts", str(texts), "--json", env=env)
    assert res.returncode == 0, res.stderr
    (result,) = [json.loads(line) for line in res.stdout.splitlines()]
    assert result["step"] == "export" and {"eval/wer", "eval/cer"} <= set(result)
    assert "eval/mcd_dtw" not in result and "eval/speaker_sim" not in result  # no references


@pytest.mark.parametrize(("args", "message"), [
    (("{export}",), "holds no held-out data: pass --texts FILE"),
    (("{export}", "--texts", "{empty}"), "no texts in it"),
    (("{export}", "--texts", "{empty}.missing"), "cannot be read: No such file or directory"),
    (("{export}", "--step", "4", "--texts", "{texts}"), "--step/--all apply to run folders"),
    (("{root}",), "is not a run folder"),
])
def test_bad_eval_input_is_one_line_and_exit_2(trained, tmp_path, args, message):
    base, env, run = trained
    export = base / "export-errors"
    if not export.exists():
        assert voxrelay("export", str(run), "-o", str(export), env=env).returncode == 0
    empty = tmp_path / "empty.txt"
    empty.write_text("\n# nothing\n")
    texts = tmp_path / "texts.txt"
    texts.write_text("Hello there.\n")
    argv = [a.format(export=export, empty=empty, texts=texts, root=base / "root") for a in args]
    res = voxrelay("eval", *argv, env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr, res.stderr
