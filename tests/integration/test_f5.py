"""The ``f5`` family end to end on a CPU: clips with transcripts -> prepare (the audio at 24 kHz) -> train a tiny
random F5 DiT (dropout, EMA on upstream's schedule) -> SIGKILL -> resume, bit-exact against a straight run (weights
and EMA) -> synthesize in a voice of the data through a tiny Vocos -> eval -> export in f5-tts' released layout;
and an f5-tts checkpoint as upstream's EMA wrote it as ``init_from``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml

from tests.helpers.datasets import make_wav
from tests.helpers.f5 import FIXTURES, TINY_F5, save_tiny_vocos
from tests.helpers.runner import Trainer, assert_same_weights, env_for, final_checkpoint, kill_once_a_checkpoint_exists
from tests.helpers.runner import voxrelay as run_cli

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

STEPS = 12
EXAMPLE = Path(__file__).parents[2] / "examples" / "f5-finetune.yaml"
WORDS = ["hello there", "how are you", "fine thanks", "see you soon", "good morning", "what a day"]


def clips(folder: Path) -> Path:
    rows = []
    for i in range(14):
        name = f"c{i}"
        make_wav(folder / "clips" / f"{name}.wav", 0.3 + 0.05 * (i % 5), 24000, freq=150.0 + 25 * i)
        rows.append({"id": name, "audio": f"clips/{name}.wav", "text": WORDS[i % len(WORDS)],
                     "speaker": ("alice", "bob")[i % 2]})
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def settings(root: str, *extra: str) -> list[str]:
    return [f"root={root}", "name=x", "data.name=clips", "data.eval_size=2", "data.shard_size=8",
            "data.min_duration=0.2", f"train.max_steps={STEPS}", "train.batch_tokens=200", "train.grad_accum=1",
            "train.warmup_steps=1", "train.eval_every=100", "train.eval_synth=1", "train.log_every=1",
            "train.time_limit=null", "checkpoint.every_minutes=null", "checkpoint.every_steps=4", *extra]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("f5")
    parts = base / "parts"
    cfg = yaml.safe_load(EXAMPLE.read_text())  # the example, made tiny: a random DiT, bytes as text, a tiny Vocos
    cfg["data"]["sources"] = [{"type": "jsonl", "path": str(clips(parts / "data"))}]
    del cfg["model"]["init_from"], cfg["model"]["vocab"]
    cfg["model"] |= {**TINY_F5, "vocoder": str(save_tiny_vocos(parts / "vocos")), "steps": 4}
    (parts / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = env_for(base / "cache")
    res = run_cli("prepare", str(parts / "config.yaml"), *settings(str(base / "root")), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return base, parts, env


def test_f5_trains_resumes_exactly_with_its_ema_speaks_and_exports_upstreams_layout(setup, tmp_path: Path):
    import torch
    from safetensors.torch import load_file

    base, parts, env = setup
    config, root = str(parts / "config.yaml"), str(base / "root")
    res = run_cli("train", config, *settings(root, "name=straight"), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    trainer = Trainer(root, env, "name=killed", config=config, settings=settings)
    kill_once_a_checkpoint_exists(trainer, base / "cache", str(base / "root/runs/killed"), STEPS)
    res = run_cli("train", config, *settings(root, "name=killed"), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    resumed = int(re.search(r"resuming \S+ from step (\d+)", res.stderr).group(1))
    assert 4 <= resumed < 10, res.stderr  # before the EMA's copy at step 10: its step must come back too
    step_a, a, ema_a = final_checkpoint(str(base / "root/runs/straight"), base / "cache/fetch")
    step_b, b, ema_b = final_checkpoint(str(base / "root/runs/killed"), base / "cache/fetch")
    assert step_a == step_b == STEPS and "ema_step" in ema_a and int(ema_a["ema_step"]) == STEPS
    assert_same_weights(a, b)
    assert_same_weights(ema_a, ema_b)

    run = base / "root/runs/killed"
    wav = tmp_path / "hi.wav"
    res = run_cli("synthesize", str(run), "good morning", "--voice", "bob", "-o", str(wav), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    audio, rate = sf.read(wav)
    assert rate == 24000 and audio.size > 0 and audio.size % 256 == 0 and np.isfinite(audio).all()
    res = run_cli("eval", str(run), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    scores = [json.loads(line) for p in run.glob("eval/step-*/scores.jsonl") for line in p.read_text().splitlines()]
    assert scores and all("wer" in s for s in scores), scores

    out = tmp_path / "export"
    res = run_cli("export", str(run), "-o", str(out), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    exported = load_file(str(out / "model.safetensors"))
    upstream = load_file(str(FIXTURES / "upstream_ema.safetensors"))  # ema_pytorch's own layout
    assert {k.split(".", 2)[1] for k in exported} == {k.split(".", 2)[1] for k in upstream if "." in k} == {
        "transformer"}
    assert {re.sub(r"\d+", "N", k) for k in exported} <= {re.sub(r"\d+", "N", k) for k in upstream}
    assert json.loads((out / "voices.json").read_text()).keys() == {"_", "alice", "bob"}
    res = run_cli("synthesize", str(out), "good morning", "--voice", "alice", "-o", str(tmp_path / "x.wav"), env=env)
    assert res.returncode == 0, res.stdout + res.stderr  # an export keeps its voices' prompts
    # the export holds the EMA's weights (what f5-tts releases), not the last step's
    name = "transformer.proj_out.weight"
    assert torch.equal(exported["ema_model." + name], ema_b["ema." + name].to(exported["ema_model." + name].dtype))


def test_an_f5_tts_checkpoint_as_upstreams_ema_wrote_it_is_init_from(tmp_path: Path):
    import torch
    from safetensors.torch import load_file

    from voxrelay.models.f5.config import F5Config
    from voxrelay.models.f5.loading import build

    meta = json.loads((FIXTURES / "reference.json").read_text())
    (tmp_path / "vocab.txt").write_text("".join(f"{t}\n" for t in meta["vocab"]))
    model = build(F5Config(init_from=str(FIXTURES / "upstream_ema.safetensors"), vocab=str(tmp_path / "vocab.txt")),
                  None, 0)
    io = load_file(str(FIXTURES / "reference.safetensors"))
    with torch.no_grad():
        field = model.dit.eval()(x=io["io.vf_x"], cond=io["io.vf_cond"], text=io["io.text_ids"],
                                 time=io["io.vf_time"], mask=io["io.mask"])
    torch.testing.assert_close(field, io["io.vf"], atol=1e-5, rtol=0)  # upstream's weights, upstream's output
    assert model.dit.sizes.dim == 64 and model.dit.sizes.depth == 2 and model.dit.sizes.dim_head == 16
