"""The Parler-TTS recipe end to end on a CPU: ``examples/parler-mini-v0.1.yaml`` itself (seed 000's run), made
tiny by overrides (a tiny random T5 + decoder, a T5-style tokenizer, a tiny random 44.1 kHz DAC with Parler's
9 x 1024 codes; an hf speech dataset whose descriptions come from a metadata dataset joined on id, as
upstream's): prepare -> train -> SIGKILL -> resume, bit-exact against a straight run -> synthesize with a
description (not silence) -> `voxrelay eval` -> export in both formats."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.helpers.parler import make_parler_corpus, save_parts
from tests.helpers.runner import (
    Trainer,
    assert_same_weights,
    env_for,
    final_weights,
    kill_once_a_checkpoint_exists,
    voxrelay,
)
from tests.helpers.speech import SENTENCES
from voxrelay.quality.mcd import silent_fraction

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # tiers: see tests/conftest.py

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "parler-mini-v0.1.yaml")
STEPS = 6


def settings(parts: dict[str, Path], corpus: dict[str, Path]):
    def tiny_parler(root: str, *extra: str) -> list[str]:
        return [
            f"root={root}", "data.name=tiny-parler",
            f"data.sources=[{{type: hf, path: {corpus['speech']}, metadata_path: {corpus['meta']}, "
            "description_column: text_description}]",
            "data.min_duration=0.3", "data.eval_size=2", "data.shard_size=8", f"codec.path={parts['dac']}",
            "codec.batch_size=4",  # clips encoded together, as upstream's audio_encoder_per_device_batch_size
            "model.preset=tiny", f"model.text_encoder={parts['text_encoder']}",
            f"model.prompt_tokenizer={parts['prompt_tokenizer']}", "model.dropout=0.1",  # resume restores the RNG
            "train.precision=no", f"train.max_steps={STEPS}", "train.batch_tokens=900", "train.grad_accum=1",
            "train.warmup_steps=1", "train.lr=3e-3", "train.eval_every=3", "train.eval_synth=1", "train.log_every=1",
            "train.time_limit=null", "train.time_limit_from=process", "train.seed=0",
            "checkpoint.every_minutes=null", "checkpoint.every_steps=2", "eval.asr=null",
            "eval.speaker_similarity=false", *extra,  # the speaker encoder costs seconds per session
        ]
    return tiny_parler


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("parler")
    parts = save_parts(base / "parts")
    corpus = make_parler_corpus(base / "corpus", SENTENCES[:5])
    env = env_for(base / "cache", {"HF_HUB_OFFLINE": "1"})
    res = voxrelay("prepare", EXAMPLE, *settings(parts, corpus)(str(base / "root")), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return base, settings(parts, corpus), env


def _train(base: Path, tiny, env: dict, name: str, *extra: str):
    res = voxrelay("train", EXAMPLE, *tiny(str(base / "root"), f"name={name}", *extra), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def test_parler_prepare_train_kill_resume_synthesize_eval_export(setup, tmp_path: Path):
    base, tiny, env = setup
    index = json.loads((base / "root/prepared/tiny-parler/index.json").read_text())
    assert (index["codec"]["type"], index["num_codebooks"]) == ("dac", 9)
    assert index["identity"]["params"]["data.required_fields"] == ["description"]
    assert index["identity"]["params"]["codec.batch_size"] == 4
    assert index["counts"]["train"] + index["counts"]["eval"] == 10  # every row found its description

    _train(base, tiny, env, "straight")
    metrics = [json.loads(line) for line in (base / "root/runs/straight/metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss" in m]
    assert all({f"loss/codebook_{k}" for k in range(9)} <= set(m) for m in steps), steps[0]
    evals = [m for m in metrics if "eval/loss" in m]
    assert evals and all({"eval/loss/codebook_8", "eval/silent_frac"} <= set(m) for m in evals), evals

    trainer = Trainer(str(base / "root"), env, "name=killed", config=EXAMPLE, settings=tiny)
    kill_once_a_checkpoint_exists(trainer, base / "cache", str(base / "root/runs/killed"), STEPS)
    res = _train(base, tiny, env, "killed")
    resumed = int(re.search(r"resuming \S+ from step (\d+)", res.stderr).group(1))
    assert 2 <= resumed < STEPS, res.stderr
    step_a, a = final_weights(str(base / "root/runs/straight"), base / "cache/fetch")
    step_b, b = final_weights(str(base / "root/runs/killed"), base / "cache/fetch")
    assert step_a == step_b == STEPS
    assert not any(k.startswith("text_encoder.") for k in a), sorted(a)[:5]  # the frozen T5 is not checkpointed
    assert any(k.startswith("decoder.lm_heads.") for k in a)
    assert_same_weights(a, b)

    run = base / "root/runs/killed"
    wav = tmp_path / "hi.wav"
    res = voxrelay("synthesize", str(run), "Hello there.", "-o", str(wav), "--description",
                   "A woman speaks with a British accent.", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    audio, sr = sf.read(wav)
    assert sr == 44100 and audio.size > 0 and np.isfinite(audio).all()
    assert silent_fraction(audio, sr) < 0.5, silent_fraction(audio, sr)  # the tiny model's audio is not silence
    refused = voxrelay("synthesize", str(run), "Hello there.", "-o", str(wav), env=env)
    assert refused.returncode == 2 and "--description" in refused.stderr and "Traceback" not in refused.stderr

    texts = tmp_path / "texts.jsonl"
    texts.write_text(json.dumps({"text": "Hello there.", "description": "A man speaks clearly."}) + "\n")
    res = voxrelay("eval", str(run), "--texts", str(texts), "--json", "--asr-model", "auto", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    scored = json.dumps(json.loads(res.stdout.strip().splitlines()[-1]))
    assert '"eval/silent_frac"' in scored and '"eval/wer"' in scored, scored  # Whisper heard the tiny model

    for fmt, marker in (("voxrelay", "voxrelay.json"), ("parler", "generation_config.json")):
        out = tmp_path / f"export-{fmt}"
        res = voxrelay("export", str(run), "-o", str(out), "--format", fmt, env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        config = json.loads((out / "config.json").read_text())
        assert config["model_type"] == "parler_tts" and (out / marker).is_file()
    # the tiny DAC is not descript's layout: transformers' DacModel, which upstream builds at any size
    assert json.loads((tmp_path / "export-parler" / "config.json").read_text())["audio_encoder"]["model_type"] == "dac"
    res = voxrelay("synthesize", str(tmp_path / "export-voxrelay"), "Hello there.", "-o", str(tmp_path / "e.wav"),
                   "--description", "A woman speaks with a British accent.", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert np.array_equal(sf.read(tmp_path / "e.wav")[0], audio)  # the export speaks as the run did


# DDP on 2 processes with a frozen part: test_vibevoice.py (CI time)
@pytest.mark.parametrize("strategy", ["fsdp"])
def test_parler_on_two_processes_resumes_exactly(setup, strategy):
    """2-process FSDP2 (decoder layers and the frozen T5's blocks as units): a run stopped halfway and
    resumed in a new session ends with the straight run's weights."""
    from tests.helpers.runner import torchrun

    base, tiny, env = setup

    def run(name: str, *extra: str):
        res = torchrun(2, "train", EXAMPLE, *tiny(str(base / "root"), f"name={name}", f"train.strategy={strategy}",
                                                  "train.eval_every=100", "train.eval_synth=0", *extra), env=env)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return res

    run(f"{strategy}-straight")
    run(f"{strategy}-split", f"train.max_steps={STEPS // 2}")
    res = run(f"{strategy}-split")
    assert int(re.search(r"resuming \S+ from step (\d+)", res.stderr).group(1)) == STEPS // 2
    assert len(re.findall(r"resuming \S+ from step", res.stderr)) == 1, res.stderr  # once per job, not per process
    step_a, a = final_weights(str(base / f"root/runs/{strategy}-straight"), base / "cache/fetch")
    step_b, b = final_weights(str(base / f"root/runs/{strategy}-split"), base / "cache/fetch")
    assert step_a == step_b == STEPS and not any(k.startswith("text_encoder.") for k in a)
    assert_same_weights(a, b)
