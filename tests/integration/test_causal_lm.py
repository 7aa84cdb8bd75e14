"""The ``causal_lm`` family end to end on a CPU with a layout no built-in model uses (written here, in YAML only): a
random-init Qwen2 over the built-in codec's 2 codebooks, frames laid out in reverse, a literal prompt, a speaker
format, loss on the speech only. prepare -> train -> SIGKILL -> resume, bit-exact against a straight run ->
synthesize -> eval -> export -> the folder loads with ``AutoModelForCausalLM`` / ``AutoTokenizer``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml

from tests.helpers.orpheus import save_llama3_tokenizer
from tests.helpers.runner import Trainer, assert_same_weights, env_for, final_weights, kill_once_a_checkpoint_exists
from tests.helpers.runner import voxrelay as run_cli
from voxrelay.cli import demo_config_path

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

STEPS = 6
DEMO = demo_config_path()
LAYOUT = {
    "name": "test-reversed", "summary": "a test-only layout: no built-in model lays codes out like this",
    "upstream": "none (tests/integration/test_causal_lm.py)", "architecture": "qwen2",
    "codec": {"type": "mel_kmeans"}, "codebooks": 2, "codebook_size": 64, "frame_order": [1, 0],
    "audio_token": "<a{}>", "base_vocab": 128256,
    "add_tokens": ["<speech>", "</speech>", {"template": "<a{}>", "count": 128}],
    "ids": {"<speech>": 128256, "<a0>": 128258},
    "prompt": "<|begin_of_text|>{text}<speech>", "speaker_format": "[{speaker}] {text}",
    "after_audio": ["</speech>"], "stop": "</speech>", "pad": "<|eot_id|>", "loss_on": "speech",
    "max_seq_len": 1024, "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
}


def settings(parts: Path):
    def tiny(root: str, *extra: str) -> list[str]:
        return [
            f"root={root}", "name=x", "data.name=two-books",
            "data.sources=[{type: demo, minutes: 0.6, seed: 1, voices: [en-us, en-gb+f3]}]",
            "data.eval_size=2", "data.shard_size=8",
            f"train.max_steps={STEPS}", "train.batch_tokens=1200", "train.grad_accum=1", "train.warmup_steps=1",
            "train.eval_every=100", "train.eval_synth=1", "train.log_every=1", "train.time_limit=null",
            "checkpoint.every_minutes=null", "checkpoint.every_steps=2", *extra,
        ]
    return tiny


def write_config(parts: Path) -> Path:
    """The demo's config with this layout's model (random init, tiny) and the built-in codec at 2 x 64."""
    cfg = yaml.safe_load(DEMO.read_text())
    cfg["codec"] = {"type": "mel_kmeans", "num_codebooks": 2, "codebook_size": 64, "hop_length": 320}
    cfg["model"] = {"family": "causal_lm", "layout": str(parts / "layout.yaml"), "tokenizer": str(parts / "tok"),
                    "hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
                    "dropout": 0.1}  # every step draws from the RNG: resume must restore it
    (parts / "config.yaml").write_text(yaml.safe_dump(cfg))
    return parts / "config.yaml"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("causal_lm")
    parts = base / "parts"
    save_llama3_tokenizer(parts / "tok")
    (parts / "layout.yaml").write_text(yaml.safe_dump(LAYOUT))
    write_config(parts)
    env = env_for(base / "cache")
    res = run_cli("prepare", str(parts / "config.yaml"), *settings(parts)(str(base / "root")), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return base, parts, env


def straight_and_killed(base: Path, parts: Path, env: dict) -> tuple[dict, dict]:
    """Train the run straight, and again SIGKILLed once a checkpoint exists then resumed; both final weights."""
    config, tiny = str(parts / "config.yaml"), settings(parts)
    res = run_cli("train", config, *tiny(str(base / "root"), "name=straight"), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    trainer = Trainer(str(base / "root"), env, "name=killed", config=config, settings=tiny)
    kill_once_a_checkpoint_exists(trainer, base / "cache", str(base / "root/runs/killed"), STEPS)
    res = run_cli("train", config, *tiny(str(base / "root"), "name=killed"), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    resumed = int(re.search(r"resuming \S+ from step (\d+)", res.stderr).group(1))
    assert 2 <= resumed < STEPS, res.stderr
    step_a, a = final_weights(str(base / "root/runs/straight"), base / "cache/fetch")
    step_b, b = final_weights(str(base / "root/runs/killed"), base / "cache/fetch")
    assert step_a == step_b == STEPS
    return a, b


def test_a_layout_of_your_own_prepares_trains_resumes_exactly_speaks_and_exports(setup, tmp_path: Path):
    base, parts, env = setup
    a, b = straight_and_killed(base, parts, env)
    assert any("embed_tokens" in k for k in a)
    assert_same_weights(a, b)

    run = base / "root/runs/killed"
    wav = tmp_path / "hi.wav"
    res = run_cli("synthesize", str(run), "hello there", "-o", str(wav), "--voice", "en-us", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    audio, _ = sf.read(wav)
    assert audio.size > 0 and np.isfinite(audio).all()
    res = run_cli("eval", str(run), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    scores = [json.loads(line) for p in run.glob("eval/step-*/scores.jsonl") for line in p.read_text().splitlines()]
    assert scores and all("wer" in s for s in scores), scores

    out = tmp_path / "export"
    res = run_cli("export", str(run), "-o", str(out), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lm = AutoModelForCausalLM.from_pretrained(str(out))
    assert type(lm).__name__ == "Qwen2ForCausalLM" and lm.config.vocab_size == 128256 + 2 + 128
    assert lm.generation_config.eos_token_id == 128257
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.convert_tokens_to_ids(["<speech>", "</speech>", "<a0>", "<a127>"]) == [128256, 128257, 128258, 128385]
    meta = json.loads((out / "voxrelay.json").read_text())
    assert meta["layout"]["name"] == "test-reversed" and meta["layout"]["frame_order"] == [1, 0]


def save_tiny_llasa(folder: Path, tokenizer: Path) -> Path:
    """A tiny random 'Llasa checkpoint': a Llama with Llasa's 193,800 rows and the tokenizer with its tokens (the
    layout's add_tokens on a Llama-3.2-Instruct tokenizer, as upstream's train_tts.py makes it)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from voxrelay.models.causal_lm.layout import load_layout
    from voxrelay.models.causal_lm.loading import load_tokenizer

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=193_800, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                                 max_position_embeddings=2048)).save_pretrained(str(folder))
    load_tokenizer(str(tokenizer), "model.tokenizer", load_layout("llasa")).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def llasa(tmp_path_factory: pytest.TempPathFactory):
    from tests.helpers.codecs_tiny import save_tiny_xcodec2
    from tests.helpers.orpheus import save_llama32_instruct_tokenizer

    base = tmp_path_factory.mktemp("llasa")
    parts = base / "parts"
    ckpt = save_tiny_llasa(parts / "llasa", save_llama32_instruct_tokenizer(parts / "tok"))
    cfg = yaml.safe_load(DEMO.read_text())
    cfg["codec"] = {"type": "xcodec2", "path": str(save_tiny_xcodec2(parts / "xcodec2"))}
    # a new language's characters, as --check-text would list them: here two the demo's English has
    cfg["model"] = {"family": "causal_lm", "layout": "llasa", "init_from": str(ckpt), "add_tokens": ["ing", "th"],
                    "dropout": 0.1, "max_seq_len": 1024}
    cfg["train"] = cfg["train"] | {"lora": {"dropout": 0.1}}
    (parts / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = env_for(base / "cache")
    res = run_cli("prepare", str(parts / "config.yaml"), *settings(parts)(str(base / "root")), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return base, parts, env


def test_llasa_lora_with_new_tokens_trains_only_their_rows_resumes_exactly_and_exports(llasa, tmp_path: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, parts, env = llasa
    index = json.loads((base / "root/prepared/two-books/index.json").read_text())
    assert (index["codec"]["type"], index["num_codebooks"], index["codec"]["codebook_size"]) == ("xcodec2", 1, 65536)
    a, b = straight_and_killed(base, parts, env)
    assert any("lora_" in k for k in a)
    assert_same_weights(a, b)

    run = base / "root/runs/killed"
    wav = tmp_path / "hi.wav"
    res = run_cli("synthesize", str(run), "the thing", "-o", str(wav), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    audio, rate = sf.read(wav)
    assert rate == 16000 and audio.size > 0 and np.isfinite(audio).all()
    out = tmp_path / "export"
    res = run_cli("export", str(run), "-o", str(out), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    lm = AutoModelForCausalLM.from_pretrained(str(out))
    tok = AutoTokenizer.from_pretrained(str(out))
    assert lm.config.vocab_size == 193_802 and tok.convert_tokens_to_ids(["ing", "th"]) == [193_800, 193_801]
    before = AutoModelForCausalLM.from_pretrained(str(parts / "llasa")).get_input_embeddings().weight
    after = lm.get_input_embeddings().weight
    # only the two new rows trained (LoRA's embeddings: new_rows); every row Llasa had is as it was
    assert torch.equal(after[:193_800], before) and not torch.equal(after[193_800:], after[:2])
    assert tok.convert_tokens_to_ids("<|s_0|>") == 128264


def test_neutts_over_neucodec_prepares_trains_speaks_at_24khz_and_exports(tmp_path: Path):
    """The neutts layout as users run it: eSpeak phonemes (phonemizer) in, NeuCodec codes out, a Qwen2 base."""
    pytest.importorskip("phonemizer")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.helpers.codecs_tiny import save_tiny_neucodec
    from tests.helpers.qwen import save_qwen2_tokenizer

    parts = tmp_path / "parts"
    cfg = yaml.safe_load(DEMO.read_text())
    cfg["codec"] = {"type": "neucodec", "path": str(save_tiny_neucodec(parts / "neucodec"))}
    cfg["model"] = {"family": "causal_lm", "layout": "neutts", "tokenizer": str(save_qwen2_tokenizer(parts / "tok")),
                    "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
    (parts / "config.yaml").write_text(yaml.safe_dump(cfg))
    env, root = env_for(tmp_path / "cache"), str(tmp_path / "root")
    tiny = [*settings(parts)(root), "train.max_steps=3", "checkpoint.every_steps=3"]
    for command in ("prepare", "train"):
        res = run_cli(command, str(parts / "config.yaml"), *tiny, env=env)
        assert res.returncode == 0, res.stdout + res.stderr
    run = tmp_path / "root/runs/x"
    res = run_cli("synthesize", str(run), "Hello there.", "-o", str(tmp_path / "hi.wav"), "--max-seconds", "1", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    audio, rate = sf.read(tmp_path / "hi.wav")
    assert rate == 24000 and audio.size > 0 and audio.size % 480 == 0  # NeuCodec decodes 480 samples per code
    res = run_cli("export", str(run), "-o", str(tmp_path / "export"), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    lm = AutoModelForCausalLM.from_pretrained(str(tmp_path / "export"))
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    assert type(lm).__name__ == "Qwen2ForCausalLM" and tok.convert_tokens_to_ids("<|speech_0|>") == 151665 + 6
