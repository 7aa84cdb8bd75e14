"""Speech scores as a user meets them: every eval of `voxrelay train` logs WER/CER and speaker
similarity (metrics, TensorBoard text, samples/step-N/scores.jsonl); `voxrelay eval` scores any
checkpoint exactly as training's eval did at that step, for every family (the same weights, seeds and
texts); a model that stops at once is evaluated, not lost; a table for --all, the plot <run>/eval.png,
--texts on an export; bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers.runner import CONFIG, env_for, voxrelay
from tests.helpers.tiny import tiny
from voxrelay.cli import app

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

# the demo's phoneme input end to end (train, checkpoint, eval, export, eval of the export)
SCORED = ("eval.asr={}", "eval.speaker_similarity=true", "train.eval_synth=2", "eval.temperature=0.5",
          "model.tokenizer=phonemes", "model.dropout=0.1")


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


def _eval(run: Path, *args) -> list[dict]:
    """`voxrelay eval RUN ARGS --json` in this process: one result per step."""
    res = CliRunner().invoke(app, ["eval", str(run), *map(str, args), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


class TinyRuns:
    """Tiny runs of the model families trained in this process (each family's parts and data made once), with the
    settings of its end-to-end test (dropout on: an eval that left dropout on would differ); 2 steps, training's
    evals at steps 0 and 2 speak the first held-out text (train.eval_synth=1)."""

    def __init__(self, base: Path):
        self.base = base
        self.made: dict[str, tuple[str, object]] = {}

    def settings(self, family: str) -> tuple[str, object]:
        if family not in self.made:
            self.made[family] = _family_settings(family, self.base / family)
        return self.made[family]

    def train(self, family: str, *extra: str):
        from voxrelay.config import load_config
        from voxrelay.data.prepare import prepare
        from voxrelay.train.build import build_run
        from voxrelay.train.loop import train

        config, settings = self.settings(family)
        cfg = load_config(config, settings(str(self.base / family / "root"), "train.max_steps=2", "train.eval_every=2",
                                           "checkpoint.every_steps=2", "train.eval_synth=1", *extra))
        prepare(cfg)  # once per family: the data is found prepared afterwards
        run = build_run(cfg)
        assert train(run).exit_code == 0
        return run


def _family_settings(family: str, parts: Path) -> tuple[str, object]:
    """(config file, settings function) of ``family``'s end-to-end test, its tiny parts written under ``parts``."""
    if family == "orpheus":
        from tests.helpers.orpheus import save_llama3_tokenizer, save_tiny_llama, save_tiny_snac
        from tests.integration import test_orpheus as t

        save_tiny_llama(parts / "orpheus", save_llama3_tokenizer(parts / "llama3-tokenizer"))
        save_tiny_snac(parts / "snac")
        settings = t.settings(parts)
        return t.EXAMPLE, lambda root, *extra: settings(root, "eval.asr=null", "eval.speaker_similarity=false", *extra)
    if family == "parler":
        from tests.helpers.parler import make_parler_corpus, save_parts
        from tests.helpers.speech import SENTENCES
        from tests.integration import test_parler as t

        return t.EXAMPLE, t.settings(save_parts(parts / "parts"), make_parler_corpus(parts / "corpus", SENTENCES[:5]))
    from tests.helpers.vibevoice import save_tiny_vibevoice
    from tests.integration import test_vibevoice as t

    return t.EXAMPLE, t.settings(save_tiny_vibevoice(parts / "tiny-vibevoice"))  # speaker similarity on


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    import huggingface_hub.constants
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the runs of `trained` (OMP_NUM_THREADS=1): the same arithmetic
    with pytest.MonkeyPatch.context() as mp:
        base = tmp_path_factory.mktemp("families")
        mp.setenv("VOXRELAY_CACHE", str(base / "cache"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # (read at import: set both)
        yield TinyRuns(base)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("family", ["codec_lm", "orpheus", "parler", "vibevoice"])
def test_voxrelay_eval_equals_trainings_eval_on_the_same_checkpoint(family, trained, tiny_runs, monkeypatch):
    """`voxrelay eval --step N --num <train.eval_synth>` gives exactly the numbers training's eval logged at step N:
    the same weights (VibeVoice: its diffusion head's EMA), the family's generators seeded alike (VibeVoice's
    σ-VAE and diffusion noise), the same texts and sampling seeds. Exactly: one process, one thread, the same
    operations on the same tensors (training's eval runs on the weights the checkpoint then saves)."""
    if family == "codec_lm":  # the demo family: the run trained above (a CLI train, Whisper and speaker similarity)
        base, _, run = trained
        monkeypatch.setenv("VOXRELAY_CACHE", str(base / "cache"))
        step, num = 6, 2
    else:
        run, step, num = tiny_runs.train(family, f"name={family}-eval").local_dir, 2, 1
    training = next(m for m in _jsonl(run / "metrics.jsonl") if m["step"] == step and "eval/loss" in m)
    (result,) = _eval(run, "--step", step, "--num", num)
    assert result.pop("step") == step and training.pop("step") == step and training.pop("time")
    assert {k: (v, training.get(k)) for k, v in result.items() if v != training.get(k)} == {}
    assert set(result) == set(training)
    on_demand = _jsonl(run / "eval" / f"step-{step:08d}" / "scores.jsonl")
    assert on_demand == _jsonl(run / "samples" / f"step-{step:08d}" / "scores.jsonl")


def test_eval_speaks_every_held_out_text_by_default(trained, monkeypatch):
    base, _, run = trained
    monkeypatch.setenv("VOXRELAY_CACHE", str(base / "cache"))
    (result,) = _eval(run, "--step", "6")
    assert result["step"] == 6 and len(_jsonl(run / "eval" / "step-00000006" / "scores.jsonl")) == 3


def test_a_model_that_stops_at_once_is_evaluated_not_lost(tiny_runs, monkeypatch, caplog, tmp_path):
    """A model that ends every utterance before its first frame (VibeVoice's EOS made certain by a logits
    processor): each eval is logged whole — loss, stopped_frac 1, empty_frac 1, length ratio 0, silence 1 — its
    empty clips reach TensorBoard and the samples folder, early stopping and keep_best see its loss; `voxrelay eval`
    says the same, with references (held-out) and without (--texts)."""
    import logging

    import soundfile as sf
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import LogitsProcessor, LogitsProcessorList

    from voxrelay.models.vibevoice.modeling import VibeVoiceTrainer

    class EndAtOnce(LogitsProcessor):
        def __init__(self, eos: int):
            self.eos = eos

        def __call__(self, input_ids, scores):
            return torch.full_like(scores, -torch.inf).index_fill_(1, torch.tensor([self.eos]), 0.0)

    generate = VibeVoiceTrainer.generate_speech

    def ends_at_once(self, **kwargs):
        return generate(self, logits_processor=LogitsProcessorList([EndAtOnce(kwargs["eos_token_id"])]), **kwargs)

    monkeypatch.setattr(VibeVoiceTrainer, "generate_speech", ends_at_once)
    caplog.set_level(logging.WARNING)
    run = tiny_runs.train("vibevoice", "name=stops-at-once", "checkpoint.keep_best=true")
    folder = run.local_dir
    evals = [m for m in _jsonl(folder / "metrics.jsonl") if "eval/loss" in m]
    assert [m["step"] for m in evals] == [0, 2], caplog.text
    for m in evals:
        found = [m.get(k) for k in ("eval/empty_frac", "eval/stopped_frac", "eval/length_ratio", "eval/silent_frac")]
        assert found == [1.0, 1.0, 0.0, 1.0], m
        assert "eval/failed_parts" not in m and "eval/mcd_dtw" not in m, m  # no audio: no distance to measure
    assert "failed" not in caplog.text
    assert run.loop.best_eval_loss == min(m["eval/loss"] for m in evals)  # early stopping counted both
    (saved,) = [c for c in run.checkpoints.store.list() if c.step == 2]
    assert saved.metrics["eval/loss"] == evals[-1]["eval/loss"]  # what keep_best compares
    events = EventAccumulator(str(folder / "tensorboard"), size_guidance={"audio": 0}).Reload()
    assert [e.step for e in events.Audio("eval/sample_0")] == [0, 2]
    (clip,) = (folder / "samples" / "step-00000002").glob("*.wav")
    assert sf.info(clip).frames == 0

    (result,) = _eval(folder, "--step", "2", "--num", "1")
    assert result == {"step": 2, **{k: v for k, v in evals[-1].items() if k not in ("step", "time")}}
    texts = tmp_path / "texts.txt"
    texts.write_text("en-us|Hello there.\n")
    (spoken,) = _eval(folder, "--step", "2", "--texts", texts)
    assert [spoken.get(k) for k in ("eval/empty_frac", "eval/stopped_frac", "eval/silent_frac")] == [1.0] * 3, spoken
    assert sf.info(folder / "eval" / "step-00000002" / "text-0001.wav").frames == 0


def test_eval_all_prints_a_table_per_checkpoint_and_writes_the_plot(trained):
    _, env, run = trained
    res = voxrelay("eval", str(run), "--all", env=env)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[0].split() == ["step", "loss", "text_gain", "wer", "cer", "silent_frac", "mcd_dtw", "speaker_sim"]
    assert [line.split()[0] for line in lines[1:-1]] == ["4", "6"]  # the checkpoints kept (keep_last 2)
    assert all(len(line.split()) == 8 and "-" not in line.split()[1:] for line in lines[1:-1])
    yardstick = ("Whisper base (packaged) (faster-whisper, beam 5), language en, Whisper's English normaliser "
                 "without its spelling map")
    assert lines[-1] == f"WER/CER by {yardstick}"  # the table says what its WER/CER are measured with
    results = _jsonl(run / "eval" / "results.jsonl")
    assert [r["step"] for r in results][-2:] == [4, 6] and {r["eval/asr"] for r in results[-2:]} == {yardstick}
    training = [m for m in _jsonl(run / "metrics.jsonl") if "eval/wer" in m]  # training's evals say it too
    assert training and {m["eval/asr"] for m in training} == {yardstick}
    scores = _jsonl(run / "eval" / "step-00000006" / "scores.jsonl")
    assert scores and {r["asr"] for r in scores} == {yardstick}
    assert (run / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_utmos_scores_a_run_trained_without_it_and_names_its_weights(trained, tmp_path):
    """`--utmos FILE` on a run whose config has eval.utmos off: a utmos column, its yardstick under the table,
    per-sample scores, the plot's fourth panel. The file: SpeechMOS' layout (tests/unit/quality/test_utmos.py checks
    its numbers against SpeechMOS' module)."""
    import struct

    import torch

    from tests.helpers.utmos_weights import stand_in_weights

    _, env, run = trained
    upstream = json.loads((Path(__file__).parents[1] / "fixtures/utmos/upstream.json").read_text())
    weights = tmp_path / "utmos22_strong_step7459_v1.pt"
    torch.save(stand_in_weights(upstream["shapes"]), weights)
    res = voxrelay("eval", str(run), "--step", "6", "--num", "2", "--utmos", str(weights), env=env)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[0].split()[-2:] == ["speaker_sim", "utmos"] and lines[1].split()[0] == "6"
    assert lines[-1] == "UTMOS by UTMOS22 strong (utmos22_strong_step7459_v1.pt)", lines
    result = _jsonl(run / "eval" / "results.jsonl")[-1]
    scores = _jsonl(run / "eval" / "step-00000006" / "scores.jsonl")
    assert len(scores) == 2 and all(isinstance(r["utmos"], float) for r in scores)
    assert result["eval/utmos"] == pytest.approx(sum(r["utmos"] for r in scores) / 2, abs=1e-4)
    assert result["eval/mos_model"] == "UTMOS22 strong (utmos22_strong_step7459_v1.pt)"
    width = struct.unpack(">I", (run / "eval.png").read_bytes()[16:20])[0]
    assert width == 2000  # four panels of 5 inches at 100 dpi: loss, WER/CER/similarity, MCD, UTMOS


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
