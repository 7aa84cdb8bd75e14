"""The ``csm`` family end to end on a CPU: conversations in a jsonl source (`conversation`, `turn` columns) ->
prepare with a tiny Mimi -> train a tiny random CSM (dropout, the depth decoder on a share of the frames) ->
SIGKILL -> resume, bit-exact against a straight run -> synthesize a two-speaker dialogue -> eval -> export loaded
by ``CsmForConditionalGeneration`` and ``AutoProcessor``; LoRA from a CSM checkpoint, its adapter applied by peft."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml

from tests.helpers.codecs_tiny import save_tiny_mimi
from tests.helpers.csm import TINY_CSM, save_csm_tokenizer
from tests.helpers.datasets import make_wav
from tests.helpers.runner import Trainer, assert_same_weights, env_for, final_weights, kill_once_a_checkpoint_exists
from tests.helpers.runner import voxrelay as run_cli

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

STEPS = 6
EXAMPLE = Path(__file__).parents[2] / "examples" / "csm-lora.yaml"
WORDS = ["hello there", "how are you", "fine thanks", "see you soon", "good morning", "what a day"]


def conversations(folder: Path) -> Path:
    """4 two-voice conversations of 4 turns (rows in shuffled order: the turn column orders them) + 2 lone rows."""
    rows = []
    for c in range(4):
        for t in (2, 0, 3, 1):
            name = f"c{c}t{t}"
            make_wav(folder / "clips" / f"{name}.wav", 0.3 + 0.1 * ((c + t) % 4), 24000, freq=180.0 + 40 * t + 15 * c)
            rows.append({"id": name, "audio": f"clips/{name}.wav", "text": WORDS[(c + t) % len(WORDS)],
                         "speaker": ("alice", "bob")[t % 2], "conversation": f"talk-{c}", "turn": t})
    for i in range(2):
        make_wav(folder / "clips" / f"lone{i}.wav", 0.4, 24000, freq=300.0 + 50 * i)
        rows.append({"id": f"lone{i}", "audio": f"clips/lone{i}.wav", "text": WORDS[i], "speaker": "alice"})
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def settings(root: str, *extra: str) -> list[str]:
    return [f"root={root}", "name=x", "data.name=talks", "data.eval_size=2", "data.shard_size=8",
            "data.min_duration=0.2",
            f"train.max_steps={STEPS}", "train.batch_tokens=400", "train.grad_accum=1", "train.warmup_steps=1",
            "train.eval_every=100", "train.eval_synth=1", "train.log_every=1", "train.time_limit=null",
            "checkpoint.every_minutes=null", "checkpoint.every_steps=2", *extra]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("csm")
    parts = base / "parts"
    cfg = yaml.safe_load(EXAMPLE.read_text())  # the example, made tiny: a random CSM over a tiny Mimi, no LoRA
    cfg["data"]["sources"] = [{"type": "jsonl", "path": str(conversations(parts / "data"))}]
    cfg["codec"] |= {"path": str(save_tiny_mimi(parts / "mimi")), "num_codebooks": 4}
    del cfg["model"]["init_from"], cfg["train"]["lora"]
    cfg["model"] |= {"tokenizer": str(save_csm_tokenizer(parts / "tok")), **TINY_CSM, "dropout": 0.1,
                     "depth_decoder_frames": 0.5, "context_turns": 2}
    (parts / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = env_for(base / "cache")
    res = run_cli("prepare", str(parts / "config.yaml"), *settings(str(base / "root")), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return base, parts, env


def straight_and_killed(base: Path, config: str, env: dict, tag: str, *extra: str) -> tuple[dict, dict]:
    """Train the run straight (``<tag>-straight``), and again SIGKILLed once a checkpoint exists then resumed
    (``<tag>-killed``); both final weights."""
    root = str(base / "root")
    res = run_cli("train", config, *settings(root, f"name={tag}-straight", *extra), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    trainer = Trainer(root, env, f"name={tag}-killed", config=config, settings=lambda r, *e: settings(r, *e, *extra))
    kill_once_a_checkpoint_exists(trainer, base / "cache", str(base / f"root/runs/{tag}-killed"), STEPS)
    res = run_cli("train", config, *settings(root, f"name={tag}-killed", *extra), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    resumed = int(re.search(r"resuming \S+ from step (\d+)", res.stderr).group(1))
    assert 2 <= resumed < STEPS, res.stderr
    step_a, a = final_weights(str(base / f"root/runs/{tag}-straight"), base / "cache/fetch")
    step_b, b = final_weights(str(base / f"root/runs/{tag}-killed"), base / "cache/fetch")
    assert step_a == step_b == STEPS
    return a, b


def test_prepare_keeps_each_rows_conversation_and_turn(setup):
    from voxrelay.data.loader import PreparedDataset

    base, _, _ = setup
    prepared = str(base / "root/prepared/talks")
    rows = PreparedDataset.open(prepared, "train").rows + PreparedDataset.open(prepared, "eval").rows
    found = {r.id: (r.conversation, r.turn) for r in rows}
    assert found["c2t3"] == ("talk-2", 3) and found["c0t0"] == ("talk-0", 0) and found["lone1"] == (None, None)
    assert {r.codes.shape[0] for r in rows} == {4}


@pytest.fixture(scope="module")
def full(setup):
    """The random CSM trained straight, and SIGKILLed then resumed; both final weights, and the resumed run's export
    (a CSM checkpoint in transformers' layout, as sesame/csm-1b is: the LoRA test's init_from)."""
    base, parts, env = setup
    a, b = straight_and_killed(base, str(parts / "config.yaml"), env, "full")
    out = base / "full-export"
    res = run_cli("export", str(base / "root/runs/full-killed"), "-o", str(out), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return a, b, out


def test_csm_trains_resumes_exactly_speaks_a_dialogue_and_exports_for_transformers(setup, full, tmp_path: Path):
    import torch
    from transformers import AutoProcessor, CsmForConditionalGeneration

    base, parts, env = setup
    a, b, out = full
    assert any("depth_decoder" in k for k in a) and not any("codec_model" in k for k in a)  # the codec is frozen
    assert_same_weights(a, b)

    run = base / "root/runs/full-killed"
    wav = tmp_path / "talk.wav"
    res = run_cli("synthesize", str(run), "Speaker 0: hello there\nSpeaker 1: fine thanks", "-o", str(wav),
                  "--max-seconds", "0.4", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    audio, rate = sf.read(wav)
    assert rate == 24000 and audio.size > 0 and audio.size % 1920 == 0 and np.isfinite(audio).all()
    res = run_cli("synthesize", str(run), "hello", "-o", str(tmp_path / "one.wav"), "--voice", "bob",
                  "--max-seconds", "0.4", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    res = run_cli("eval", str(run), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    scores = [json.loads(line) for p in run.glob("eval/step-*/scores.jsonl") for line in p.read_text().splitlines()]
    assert scores and all("wer" in s for s in scores), scores

    csm = CsmForConditionalGeneration.from_pretrained(str(out))
    assert torch.equal(csm.depth_decoder.model.layers[0].mlp.down_proj.weight,
                       b["csm.depth_decoder.model.layers.0.mlp.down_proj.weight"].float())
    processor = AutoProcessor.from_pretrained(str(out))
    clip, _ = sf.read(parts / "data/clips/c0t0.wav", dtype="float32")
    talk = [{"role": "0", "content": [{"type": "text", "text": "hello there"}, {"type": "audio", "path": clip}]},
            {"role": "1", "content": [{"type": "text", "text": "fine thanks"}]}]
    inputs = processor.apply_chat_template(talk, tokenize=True, return_dict=True)
    codes = csm.generate(**inputs, max_new_tokens=3, do_sample=False, suppress_tokens=[2048, 2049, 2050],
                         depth_decoder_do_sample=False, depth_decoder_suppress_tokens=[2048, 2049, 2050])
    assert codes.shape[0] == 1 and codes.shape[2] == 4  # upstream's generation runs on the export


def test_csm_lora_from_a_checkpoint_resumes_exactly_and_its_adapter_loads_in_peft(setup, full, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import CsmForConditionalGeneration

    base, parts, env = setup
    checkpoint = full[2]  # a CSM in transformers' layout, as sesame/csm-1b
    cfg = yaml.safe_load((parts / "config.yaml").read_text())
    cfg["model"] = yaml.safe_load(EXAMPLE.read_text())["model"] | {"init_from": str(checkpoint), "dropout": 0.1,
                                                                   "depth_decoder_frames": 0.5}
    cfg["train"]["lora"] = {"dropout": 0.1}  # the family's r 32, alpha 32 targets
    config = tmp_path / "lora.yaml"
    config.write_text(yaml.safe_dump(cfg))
    a, b = straight_and_killed(base, str(config), env, "lora", "train.lr=0.01")
    adapted = [k for k in a if "lora_A" in k]
    assert adapted and all(("backbone_model" in k or "depth_decoder" in k) and "codec" not in k for k in adapted)
    assert_same_weights(a, b)

    out = tmp_path / "adapter"
    res = run_cli("export", str(base / "root/runs/lora-killed"), "-o", str(out), "--adapter-only", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    plain = CsmForConditionalGeneration.from_pretrained(str(checkpoint))
    tuned = PeftModel.from_pretrained(CsmForConditionalGeneration.from_pretrained(str(checkpoint)), str(out))
    merged = tuned.merge_and_unload()
    name = "backbone_model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged.state_dict()[name], plain.state_dict()[name])  # the adapter changed it
    from peft import AutoPeftModel

    auto = AutoPeftModel.from_pretrained(str(out))  # the base named in adapter_config.json, as peft users load it
    assert torch.equal(auto.merge_and_unload().state_dict()[name], merged.state_dict()[name])
    res = run_cli("synthesize", str(out), "hello", "--voice", "alice", "-o", str(tmp_path / "a.wav"),
                  "--max-seconds", "0.4", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
