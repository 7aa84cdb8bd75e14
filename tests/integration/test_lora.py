"""LoRA end to end through the CLI: a base that changed behind the same ``model.init_from`` is refused
on resume and in synthesis (exit 2, naming both hashes) and accepted once it is back; the merged
export speaks exactly as the run's checkpoint (and unlike the bare base); the adapter-only export
holds peft's files, is much smaller and speaks the same too."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from tests.helpers.prepared import copy_corpus
from tests.helpers.runner import CONFIG, env_for, voxrelay
from tests.helpers.tiny import tiny
from voxrelay.config import load_config
from voxrelay.data.prepare import load_index, load_prepared_codec
from voxrelay.models.base import DataSpec
from voxrelay.models.registry import build_model
from voxrelay.train.strategies import base_hash

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py

TEXT, VOICE = "The quiet river carries seven boats.", "en-us"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, shared_tmp):
    """A local root with the tiny prepared corpus (shared by the tests of this module)."""
    return copy_corpus(shared_tmp, tmp_path_factory.mktemp("lora"))


def _run(base: Path, cmd: str, *args: str, code: int = 0):
    extra = (CONFIG, *tiny(str(base / "root"), *args)) if cmd == "train" else args
    res = voxrelay(cmd, *extra, env=env_for(base / "cache"))
    assert res.returncode == code, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    return res


def _build(base: Path, *overrides: str, seed: int = 0):
    """The model the tiny config builds (before any training) on the prepared data."""
    cfg = load_config(CONFIG, tiny(str(base / "root"), *overrides))
    index = load_index(cfg.prepared_uri)
    return build_model(cfg.model, DataSpec.from_prepared(index, load_prepared_codec(cfg.prepared_uri, index)), seed)


def _save_base(base: Path, folder: Path, seed: int) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    _build(base, seed=seed).save_pretrained(folder)


def _manifest(run: Path, step: int) -> dict:
    return json.loads((run / f"checkpoints/step-{step:08d}/manifest.json").read_text())


def test_a_base_changed_behind_init_from_is_refused(prepared, tmp_path):
    folder, run = tmp_path / "base", prepared / "root/runs/rebased"
    _save_base(prepared, folder, seed=0)
    args = ("name=rebased", f"model.init_from={folder}", "train.lora.r=4", "train.eval_every=100")
    _run(prepared, "train", *args, "train.max_steps=2")
    trained_on = _manifest(run, 2)["base_hash"]
    assert trained_on == base_hash(_build(prepared, f"model.init_from={folder}").module)
    _save_base(prepared, folder, seed=1)  # other weights under the same name: nothing in the config changed
    now = base_hash(_build(prepared, f"model.init_from={folder}").module)
    assert now != trained_on
    res = _run(prepared, "train", *args, "train.max_steps=4", code=2)
    assert f"cannot resume {run} from step 2" in res.stderr
    assert f"hash {trained_on}, but model.init_from='{folder}' now gives a base with hash {now}" in res.stderr
    assert "--fresh" in res.stderr and "name=rebased-2" in res.stderr
    res = _run(prepared, "synthesize", str(run), TEXT, "-o", str(tmp_path / "a.wav"), code=2)
    assert f"cannot load {run} at step 2" in res.stderr and trained_on in res.stderr and now in res.stderr
    _save_base(prepared, folder, seed=0)  # the original base back: the run continues
    res = _run(prepared, "train", *args, "train.max_steps=4")
    assert re.search(r"resuming \S+ from step 2", res.stderr), res.stderr


def test_exports_speak_as_the_run(prepared, tmp_path):
    # a high lr so that 6 steps move the adapters far enough to change what the model says
    _run(prepared, "train", "name=lora-x", "train.lora.r=4", "train.lora.modules_to_save=[]", "train.lr=1e-2",
         "train.eval_every=100")
    from voxrelay.inference import load_from_export, load_from_run

    run = str(prepared / "root/runs/lora-x")
    model, _, step = load_from_run(run)
    said = model.generate(TEXT, speaker=VOICE, max_frames=40, temperature=0)
    assert said.shape[1] > 1
    bare = _build(prepared).generate(TEXT, speaker=VOICE, max_frames=40, temperature=0)
    assert not np.array_equal(said, bare)  # the adapters change the codes: the comparisons below can fail

    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    _run(prepared, "export", run, "-o", str(merged))
    _run(prepared, "export", run, "-o", str(adapter), "--adapter-only")
    weights = load_file(merged / "model.safetensors")
    assert weights and not any("lora" in k or "base_model" in k for k in weights)  # a plain model of the family
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}
    assert not (adapter / "model.safetensors").exists()
    note = json.loads((adapter / "voxrelay.json").read_text())["lora"]
    assert note["base"] == "the random init of train.seed=0" and note["model"]["init_from"] is None
    assert note["base_hash"] == _manifest(Path(run), step)["base_hash"]
    sizes = {p.name: p.stat().st_size for p in (merged / "model.safetensors", adapter / "adapter_model.safetensors")}
    assert sizes["adapter_model.safetensors"] * 5 < sizes["model.safetensors"], sizes
    for folder in (merged, adapter):
        exported, _ = load_from_export(str(folder))
        np.testing.assert_array_equal(exported.generate(TEXT, speaker=VOICE, max_frames=40, temperature=0), said)
    res = _run(prepared, "export", run, "-o", str(adapter), code=2)  # merged weights beside the adapter: no
    assert "holds an adapter-only export" in res.stderr
