"""The Orpheus LoRA recipe end to end on a CPU: ``examples/orpheus-lora.yaml`` itself, made tiny by overrides
(a tiny random Llama with Orpheus' vocabulary and tied embeddings, a Llama-3-style tokenizer, a tiny random
SNAC at 24 kHz): prepare -> train with LoRA -> SIGKILL -> resume, bit-exact against a straight run ->
synthesize -> export -> the folder loads with ``LlamaForCausalLM.from_pretrained`` and its tokenizer maps
Orpheus' special tokens to upstream's ids."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from tests.helpers.orpheus import save_llama3_tokenizer, save_tiny_llama, save_tiny_snac
from tests.helpers.runner import (
    Trainer,
    assert_same_weights,
    env_for,
    final_weights,
    kill_once_a_checkpoint_exists,
    voxrelay,
)

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "orpheus-lora.yaml")
STEPS = 8


def settings(parts: Path):
    def tiny_orpheus(root: str, *extra: str) -> list[str]:
        return [
            f"root={root}",
            "data.sources=[{type: demo, minutes: 0.6, seed: 1, voices: [en-us, en-gb+f3]}]",
            "data.eval_size=2", "data.shard_size=8",
            f"codec.path={parts / 'snac'}", f"model.init_from={parts / 'orpheus'}", "model.max_seq_len=1024",
            "model.dropout=0.1", "train.lora.dropout=0.1",  # every step draws from the RNG: resume must restore it
            # the example's bf16: LoRA's default holds the frozen base in bf16, the adapters in fp32 (issue 34)
            "train.precision=bf16", f"train.max_steps={STEPS}", "train.batch_tokens=1500", "train.grad_accum=1",
            "train.warmup_steps=1", "train.eval_every=100", "train.eval_synth=1", "train.log_every=1",
            "train.time_limit=null", "checkpoint.every_minutes=null", "checkpoint.every_steps=2",
            "train.gradient_checkpointing=false",  # its recompute would double CI's time; fsdp tests cover it
            *extra,
        ]
    return tiny_orpheus


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("orpheus")
    parts = base / "parts"
    tok = save_llama3_tokenizer(parts / "llama3-tokenizer")
    save_tiny_llama(parts / "orpheus", tok)
    save_tiny_snac(parts / "snac")
    env = env_for(base / "cache")
    res = voxrelay("prepare", EXAMPLE, *settings(parts)(str(base / "root")), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return base, parts, env


def _train(base: Path, parts: Path, env: dict, name: str, *extra: str):
    res = voxrelay("train", EXAMPLE, *settings(parts)(str(base / "root"), f"name={name}", *extra), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def test_orpheus_lora_prepare_train_kill_resume_synthesize_export(setup, tmp_path: Path):
    base, parts, env = setup
    index = json.loads((base / "root/prepared/my-voices-snac/index.json").read_text())
    assert (index["codec"]["type"], index["num_codebooks"]) == ("snac", 7)

    _train(base, parts, env, "straight")
    # every family's eval speaks through the seam and is scored (Whisper WER/CER, speaker similarity)
    metrics = [json.loads(line) for line in (base / "root/runs/straight/metrics.jsonl").read_text().splitlines()]
    evals = [m for m in metrics if "eval/loss" in m]
    assert evals and all({"eval/wer", "eval/cer", "eval/speaker_sim"} <= set(m) for m in evals), evals
    trainer = Trainer(str(base / "root"), env, "name=killed", config=EXAMPLE, settings=settings(parts))
    kill_once_a_checkpoint_exists(trainer, base / "cache", str(base / "root/runs/killed"), STEPS)
    res = _train(base, parts, env, "killed")
    resumed = int(re.search(r"resuming \S+ from step (\d+)", res.stderr).group(1))
    assert 2 <= resumed < STEPS, res.stderr
    step_a, a = final_weights(str(base / "root/runs/straight"), base / "cache/fetch")
    step_b, b = final_weights(str(base / "root/runs/killed"), base / "cache/fetch")
    assert step_a == step_b == STEPS
    assert any("lora_" in k for k in a) and not any("layers.0.mlp.up_proj.base_layer" in k for k in a), sorted(a)
    # an Orpheus checkpoint holds the audio tokens: nothing of the embeddings trains, the adapters are float32
    assert all("lora_" in k for k in a) and {t.dtype for t in a.values()} == {torch.float32}, sorted(a)
    assert_same_weights(a, b)

    run = base / "root/runs/killed"
    wav = tmp_path / "hi.wav"
    res = voxrelay("synthesize", str(run), "hello <laugh> there", "-o", str(wav), "--voice", "en-us", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    audio, sr = sf.read(wav)
    assert sr == 24000 and audio.size > 0 and np.isfinite(audio).all()

    out = tmp_path / "export"
    res = voxrelay("export", str(run), "-o", str(out), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    from transformers import AutoTokenizer, LlamaForCausalLM

    lm = LlamaForCausalLM.from_pretrained(str(out))  # merged: a plain Llama, no peft needed
    assert lm.config.vocab_size == 156940 and not any("lora" in k for k in lm.state_dict())
    base_lm = LlamaForCausalLM.from_pretrained(str(parts / "orpheus"), dtype=torch.bfloat16)
    # the embeddings as pretrained (held in bf16 under LoRA), still tied to lm_head; the projections merged
    assert torch.equal(lm.get_input_embeddings().weight.to(torch.bfloat16), base_lm.get_input_embeddings().weight)
    assert lm.lm_head.weight.data_ptr() == lm.get_input_embeddings().weight.data_ptr()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(lm.state_dict()[q].to(torch.bfloat16), base_lm.state_dict()[q])
    tok = AutoTokenizer.from_pretrained(str(out))
    special = {"<|begin_of_text|>": 128000, "<|eot_id|>": 128009, "<custom_token_1>": 128257,
               "<custom_token_2>": 128258, "<custom_token_3>": 128259, "<custom_token_4>": 128260,
               "<custom_token_5>": 128261, "<custom_token_6>": 128262, "<custom_token_7>": 128263,
               "<custom_token_10>": 128266}
    assert {t: tok.convert_tokens_to_ids(t) for t in special} == special
