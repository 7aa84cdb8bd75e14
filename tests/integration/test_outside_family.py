"""Adding a family is one folder plus one registry entry: the test-only ``fake`` family (tests/helpers/fake_family.py,
a GRU in plain torch, registered by ``VOXRELAY_FAMILIES`` alone) prepares, trains, resumes exactly, synthesizes,
exports, evaluates and plans through voxrelay's commands, with no file under src/ naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import soundfile as sf
import yaml

from tests.helpers.fake_family import FakeConfig
from tests.helpers.fake_family_model import build
from tests.helpers.runner import CONFIG, assert_same_weights, env_for, final_weights, staging_dir, voxrelay
from tests.helpers.tiny import TINY
from voxrelay.models.base import DataSpec

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

SRC = Path(__file__).parents[2] / "src" / "voxrelay"
FAMILY = {"VOXRELAY_FAMILIES": "tests.helpers.fake_family:SPEC"}


def _args(root: Path, *extra: str) -> list[str]:
    """The tiny demo run with a ``model:`` section of the fake family (written beside ``root``)."""
    config = root.parent / "fake.yaml"
    if not config.exists():
        demo = yaml.safe_load(Path(CONFIG).read_text())
        config.write_text(yaml.safe_dump(demo | {"model": {"family": "fake", "dropout": 0.2}}))
    data = [o for o in TINY if not o.startswith("model.")]  # the codec_lm keys of the tiny config
    return [str(config), f"root={root}", *data, "train.schedule=constant_with_warmup", *extra]


def _ok(res, what: str) -> str:
    assert res.returncode == 0, f"{what} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout + res.stderr


def test_a_family_from_outside_src_trains_resumes_speaks_exports_and_plans(tmp_path):
    assert not any("fake_family" in p.read_text() for p in SRC.rglob("*.py"))
    cache = tmp_path / "cache"
    env = env_for(cache, FAMILY)
    root = tmp_path / "root"
    _ok(voxrelay("prepare", *_args(root), env=env), "prepare")

    # straight to step 6, and 4 then 6 in two sessions: the same weights (dropout 0.2: the RNG is restored; a
    # schedule that does not hang on max_steps, which the first session sets lower)
    _ok(voxrelay("train", *_args(root, "name=straight", "train.eval_every=100"), env=env), "straight run")
    _ok(voxrelay("train", *_args(root, "name=split", "train.max_steps=4", "train.eval_every=100"), env=env),
        "first session")
    out = _ok(voxrelay("train", *_args(root, "name=split", "train.eval_every=100"), env=env), "resumed session")
    assert "resum" in out.lower()
    straight_uri, split_uri = str(root / "runs" / "straight"), str(root / "runs" / "split")
    step_a, a = final_weights(straight_uri, staging_dir(cache, straight_uri))
    step_b, b = final_weights(split_uri, staging_dir(cache, split_uri))
    assert step_a == step_b == 6 and set(a) == {"embed.weight", "rnn.weight_ih_l0", "rnn.weight_hh_l0",
                                                "rnn.bias_ih_l0", "rnn.bias_hh_l0", "proj.weight", "proj.bias",
                                                "head.weight", "head.bias"}
    assert_same_weights(a, b)

    wav = tmp_path / "out.wav"
    _ok(voxrelay("synthesize", straight_uri, "hello there", "-o", str(wav), "--max-seconds", "1", env=env),
        "synthesize")
    audio, rate = sf.read(wav)
    assert rate > 0 and audio.size > 0

    export = tmp_path / "export"
    _ok(voxrelay("export", straight_uri, "-o", str(export), env=env), "export")
    assert json.loads((export / "voxrelay.json").read_text())["family"] == "fake"
    voices = _ok(voxrelay("voices", str(export), env=env), "voices of the export")
    assert "en-us" in voices and "en-gb+f3" in voices
    again = tmp_path / "again.wav"
    _ok(voxrelay("synthesize", str(export), "hello there", "-o", str(again), "--max-seconds", "1", env=env),
        "synthesize from the export")
    assert sf.read(again)[0].size > 0

    # plan prices the family's own module: weights and gradients of its 28k float32 parameters, AdamW's 2 states
    res = voxrelay("plan", *_args(root), "--json", env=env)
    _ok(res, "plan")
    rows = json.loads(res.stdout)
    full = next(r for r in rows if r["strategy"] == "ddp" and not r["lora"] and r["optimizer"] == "adamw"
                and not r["gradient_checkpointing"])
    numel = sum(p.numel() for p in build(FakeConfig(), DataSpec(2, 32), 0).module.parameters())
    assert full["per_gpu_bytes"]["weights"] == full["per_gpu_bytes"]["grads"] == 4 * numel
    assert full["per_gpu_bytes"]["optimizer"] == 8 * numel + 4 * 9  # 2 states + a step counter per tensor
    lora = next(r for r in rows if r["lora"])
    assert 0 < lora["per_gpu_bytes"]["grads"] < full["per_gpu_bytes"]["grads"]  # proj's adapters + the head


def test_an_unimportable_plugin_is_named_where_its_family_is_asked_for(tmp_path):
    env = env_for(tmp_path / "cache", {"VOXRELAY_FAMILIES": "tests.helpers.no_such_module:SPEC"})
    assert voxrelay("config", "show", CONFIG, env=env).returncode == 0  # a family nobody asks for stops nothing
    res = voxrelay("config", "show", CONFIG, "model={family: fake}", env=env)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "model.family='fake' is not a model family" in res.stderr
    assert "VOXRELAY_FAMILIES='tests.helpers.no_such_module:SPEC' could not be imported" in res.stderr
