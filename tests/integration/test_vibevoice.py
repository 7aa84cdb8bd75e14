"""The VibeVoice recipe end to end on a CPU: ``examples/vibevoice-lora.yaml`` itself (seed 003's run), made tiny
by overrides (a tiny random VibeVoice checkpoint in transformers' layout with a Qwen2 tokenizer; the demo source's
two-voice dialogues in seed 003's folder layout): prepare -> train with LoRA -> SIGKILL -> resume, bit-exact
(weights and the diffusion head's EMA) against a straight run -> dialogue synthesis with two voice prompts ->
`voxrelay eval` -> exports that transformers loads, whose LoRA changes the model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from tests.helpers.runner import (
    Trainer,
    assert_same_weights,
    env_for,
    final_checkpoint,
    kill_once_a_checkpoint_exists,
    voxrelay,
)
from tests.helpers.vibevoice import save_tiny_vibevoice

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # tiers: see tests/conftest.py

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "vibevoice-lora.yaml")
STEPS = 6


def settings(init_from: Path):
    def tiny_vibevoice(root: str, *extra: str) -> list[str]:
        return [
            f"root={root}", "data.name=tiny-dialogues",
            "data.sources=[{type: demo, layout: dialogues, minutes: 1.5, voices: [en-us, en-gb+f3], seed: 1}]",
            "data.min_duration=0.3", "data.eval_size=2", "data.shard_size=16", "data.max_duration=60",
            f"model.init_from={init_from}", "model.max_length=1024", "model.ema_decay=0.9",
            "model.ce_loss_weight=1.0", "model.diffusion_loss_weight=1.0", "model.dropout=0.1",
            "train.precision=no", f"train.max_steps={STEPS}", "train.batch_tokens=1200", "train.grad_accum=1",
            "train.warmup_steps=1", "train.lr=3e-3", "train.eval_every=3", "train.eval_synth=1", "train.log_every=1",
            "train.time_limit=null", "train.time_limit_from=process", "train.seed=0", "train.lora.r=4",
            "checkpoint.every_minutes=null", "checkpoint.every_steps=2", "checkpoint.every_epochs=null",
            "eval.asr=null", "eval.speaker_similarity=true", *extra,
        ]
    return tiny_vibevoice


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("vibevoice")
    ckpt = save_tiny_vibevoice(base / "tiny-vibevoice")
    env = env_for(base / "cache", {"HF_HUB_OFFLINE": "1"})
    tiny = settings(ckpt)
    res = voxrelay("prepare", EXAMPLE, *tiny(str(base / "root")), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return base, tiny, env, ckpt


def _train(base: Path, tiny, env: dict, name: str, *extra: str):
    res = voxrelay("train", EXAMPLE, *tiny(str(base / "root"), f"name={name}", *extra), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def _corpus(base: Path) -> Path:
    return next((base / "cache").rglob("demo-*-dialogues"))


def test_vibevoice_prepare_train_kill_resume_synthesize_eval_export(setup, tmp_path: Path):
    base, tiny, env, ckpt = setup
    index = json.loads((base / "root/prepared/tiny-dialogues/index.json").read_text())
    assert index["codec"]["type"] == "pcm" and index["codec"]["sample_rate"] == 24000
    assert index["counts"]["rejected"] == 0 and index["identity"]["params"]["data.max_seconds"] > 100

    _train(base, tiny, env, "straight")
    metrics = [json.loads(line) for line in (base / "root/runs/straight/metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss" in m]
    assert all({"loss/ce", "loss/diffusion"} <= set(m) for m in steps), steps[0]
    evals = [m for m in metrics if "eval/loss" in m]
    assert evals and all({"eval/loss/ce", "eval/loss/diffusion", "eval/silent_frac"} <= set(m) for m in evals)

    trainer = Trainer(str(base / "root"), env, "name=killed", config=EXAMPLE, settings=tiny)
    kill_once_a_checkpoint_exists(trainer, base / "cache", str(base / "root/runs/killed"), STEPS)
    res = _train(base, tiny, env, "killed")
    resumed = int(re.search(r"resuming \S+ from step (\d+)", res.stderr).group(1))
    assert 2 <= resumed < STEPS, res.stderr
    step_a, a, ema_a = final_checkpoint(str(base / "root/runs/straight"), base / "cache/fetch")
    step_b, b, ema_b = final_checkpoint(str(base / "root/runs/killed"), base / "cache/fetch")
    assert step_a == step_b == STEPS
    assert not any("audio_tower" in k or "semantic_tokenizer" in k or "latent_" in k for k in a)  # frozen: rebuilt
    assert any("lora_A" in k for k in a) and any("diffusion_head" in k for k in a)
    assert_same_weights(a, b)
    assert ema_a and ema_a.keys() == ema_b.keys() and all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)
    head = next(k for k in a if "diffusion_head" in k and "cond_proj" in k)
    assert not torch.equal(ema_a["ema.diffusion_head.cond_proj.weight"], a[head])  # an average, not the weights

    run, corpus = base / "root/runs/killed", _corpus(base)
    script = tmp_path / "dialogue.txt"
    script.write_text("Speaker 0: Hello there, how are you?\nSpeaker 1: Fine, thank you.\n")
    wav = tmp_path / "dialogue.wav"
    res = voxrelay("synthesize", str(run), "--script", str(script), "--voice", f"0={corpus / 'audio/s00001.wav'}",
                   "--voice", f"1={corpus / 'audio/s00003.wav'}", "-o", str(wav), "--max-seconds", "3", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    audio, sr = sf.read(wav)
    assert sr == 24000 and 0 < audio.size <= 3 * 24000 and audio.size % 3200 == 0 and np.isfinite(audio).all()
    assert sf.info(corpus / "audio/s00001.wav").samplerate == 22050  # the prompts were resampled to 24 kHz
    refused = voxrelay("synthesize", str(run), "--script", str(script), "--voice", f"0={corpus / 'audio/s00001.wav'}",
                       "-o", str(wav), env=env)
    assert refused.returncode == 2 and "2 speaker(s)" in refused.stderr and "Traceback" not in refused.stderr
    unreadable = voxrelay("synthesize", str(run), "Hi.", "--voice", f"0={script}", "-o", str(wav), env=env)
    assert unreadable.returncode == 2 and "cannot be read as audio" in unreadable.stderr, unreadable.stderr

    res = voxrelay("eval", str(run), "--json", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    scored = json.loads(res.stdout.strip().splitlines()[-1])
    assert {"eval/loss/ce", "eval/loss/diffusion", "eval/silent_frac"} <= set(scored), scored
    texts = tmp_path / "dialogues.jsonl"  # a dialogue of the corpus' two voices: WER, and similarity per speaker
    texts.write_text(json.dumps({"text": "[SPEAKER_A] Hello there.\n[SPEAKER_B] Fine, thanks.",
                                 "speaker": "en-us,en-gb+f3"}) + "\n")
    res = voxrelay("eval", str(run), "--texts", str(texts), "--json", "--asr-model", "auto", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    scored = json.loads(res.stdout.strip().splitlines()[-1])
    assert {"eval/wer", "eval/speaker_sim", "eval/speaker_sim/0", "eval/speaker_sim/1"} <= set(scored), scored

    _check_exports(run, ckpt, tmp_path, env, ema_b)


def _check_exports(run: Path, base_ckpt: Path, tmp_path: Path, env: dict, ema: dict) -> None:
    """The merged export loads with transformers, holds the EMA head, and its LoRA-trained weights differ from the
    base's; the adapter-only export speaks as the run does."""
    from transformers import VibeVoiceForConditionalGeneration

    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    for out, extra in ((merged, ()), (adapter, ("--adapter-only",))):
        res = voxrelay("export", str(run), "-o", str(out), *extra, env=env)
        assert res.returncode == 0, res.stdout + res.stderr
    net = VibeVoiceForConditionalGeneration.from_pretrained(str(merged))
    base = VibeVoiceForConditionalGeneration.from_pretrained(str(base_ckpt))
    q = "model.language_model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(net.state_dict()[q], base.state_dict()[q])  # the LoRA is in the merged weights
    assert torch.equal(net.state_dict()["model.diffusion_head.cond_proj.weight"],
                       ema["ema.diffusion_head.cond_proj.weight"])
    frozen = [k for k in base.state_dict() if k.startswith(("model.audio_tower.", "model.semantic_tokenizer"))]
    assert frozen and all(torch.equal(net.state_dict()[k], base.state_dict()[k]) for k in frozen)
    outputs = {}
    for name, source in (("run", run), ("adapter", adapter), ("merged", merged)):
        wav = tmp_path / f"{name}.wav"
        res = voxrelay("synthesize", str(source), "Speaker 0: Good morning.", "-o", str(wav), "--max-seconds", "2",
                       env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        outputs[name] = sf.read(wav)[0]
    assert np.array_equal(outputs["run"], outputs["adapter"]) and outputs["merged"].size > 0


# FSDP2 on 2 processes with frozen parts: test_parler.py (CI time); seed 003 trains VibeVoice with DDP
@pytest.mark.parametrize("strategy", ["ddp"])
def test_vibevoice_on_two_processes_resumes_exactly(setup, strategy):
    """2-process DDP with LoRA + EMA + family generators: a run stopped halfway and resumed in a new session ends
    with the straight run's weights and EMA (a constant learning rate: the split run's first half has max_steps
    halved)."""
    from tests.helpers.runner import torchrun

    base, tiny, env, _ = setup

    def run(name: str, *extra: str):
        res = torchrun(2, "train", EXAMPLE, *tiny(str(base / "root"), f"name={name}", f"train.strategy={strategy}",
                                                  "train.eval_every=100", "train.eval_synth=0",
                                                  "train.schedule=constant_with_warmup", *extra), env=env)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return res

    run(f"{strategy}-straight")
    run(f"{strategy}-split", f"train.max_steps={STEPS // 2}")
    res = run(f"{strategy}-split")
    assert int(re.search(r"resuming \S+ from step (\d+)", res.stderr).group(1)) == STEPS // 2
    step_a, a, ema_a = final_checkpoint(str(base / f"root/runs/{strategy}-straight"), base / "cache/fetch")
    step_b, b, ema_b = final_checkpoint(str(base / f"root/runs/{strategy}-split"), base / "cache/fetch")
    assert step_a == step_b == STEPS and not any("audio_tower" in k for k in a)
    assert_same_weights(a, b)
    assert ema_a and all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)


def test_vibevoice_stops_early_on_its_eval_loss(setup):
    """train.early_stopping_patience works on this family's two-term eval loss: a learning rate that warms up far
    too high makes it worse after its first evaluation, and the run ends as finished (early stopping)."""
    base, tiny, env, _ = setup
    _train(base, tiny, env, "early", "train.max_steps=30", "train.eval_every=2", "train.lr=3", "train.warmup_steps=10",
           "train.clip_norm=null", "train.eval_synth=0", "train.early_stopping_patience=1", "train.lora=null")
    status = voxrelay("status", str(base / "root/runs/early"), env=env).stdout
    assert "finished     yes (early stopping)" in status and "of 30" in status, status


def test_precomputed_latents_train_as_the_audio_and_are_refused_for_other_encoders(setup, tmp_path: Path):
    """codec.type=vibevoice_latents: prepare stores the encoders' outputs of model.init_from (a fraction of the
    audio's bytes); a run on them ends with the weights of the same run on the audio, bit for bit; eval takes voice
    prompts of the corpus' voices from them; a model with other encoders is refused (exit 2, naming the fix)."""
    base, tiny, env, ckpt = setup
    latents = ("data.name=tiny-latents", "codec.type=vibevoice_latents", f"codec.path={ckpt}")
    res = voxrelay("prepare", EXAMPLE, *tiny(str(base / "root"), *latents), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    index = json.loads((base / "root/prepared/tiny-latents/index.json").read_text())
    audio_index = json.loads((base / "root/prepared/tiny-dialogues/index.json").read_text())
    assert index["codec"]["type"] == "vibevoice_latents" and index["counts"] == audio_index["counts"]
    size = {name: sum(p.stat().st_size for p in (base / f"root/prepared/{name}/shards").glob("train-*.parquet"))
            for name in ("tiny-latents", "tiny-dialogues")}
    assert size["tiny-latents"] * 4 < size["tiny-dialogues"], size

    short = ("train.max_steps=3", "train.eval_every=100", "train.eval_synth=0")
    _train(base, tiny, env, "on-audio", *short)
    _train(base, tiny, env, "on-latents", *short, *latents)
    step_a, a, ema_a = final_checkpoint(str(base / "root/runs/on-audio"), base / "cache/fetch")
    step_b, b, ema_b = final_checkpoint(str(base / "root/runs/on-latents"), base / "cache/fetch")
    assert step_a == step_b == 3
    assert_same_weights(a, b)
    assert all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)

    res = voxrelay("eval", str(base / "root/runs/on-latents"), "--json", env=env)  # held out: prompts as stored
    assert res.returncode == 0, res.stdout + res.stderr
    assert {"eval/loss/diffusion", "eval/length_ratio"} <= set(json.loads(res.stdout.strip().splitlines()[-1]))
    texts = tmp_path / "dialogues.jsonl"  # the corpus' voices: prompts from their stored latents
    texts.write_text(json.dumps({"text": "[SPEAKER_A] Hello there.\n[SPEAKER_B] Fine, thanks.",
                                 "speaker": "en-us,en-gb+f3"}) + "\n")
    res = voxrelay("eval", str(base / "root/runs/on-latents"), "--texts", str(texts), "--json", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert {"eval/speaker_sim/0", "eval/speaker_sim/1"} <= set(json.loads(res.stdout.strip().splitlines()[-1]))
    res = voxrelay("train", EXAMPLE, *tiny(str(base / "root"), "name=config-says-audio", "data.name=tiny-latents",
                                           *short), env=env)  # the example's codec (pcm) on the latents
    assert res.returncode == 2 and "codec.type 'vibevoice_latents' -> 'pcm'" in res.stderr, res.stderr

    other = save_tiny_vibevoice(tmp_path / "other-vibevoice", seed=1)
    res = voxrelay("train", EXAMPLE, *tiny(str(base / "root"), "name=other-encoders", *latents, *short),
                   f"model.init_from={other}", env=env)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "encoders have other weights" in res.stderr and f"codec.path={other}" in res.stderr
