"""Every model and codec source key (`model.init_from`, tokenizers, the text encoder, `codec.path`) that names a
missing local folder is refused naming the key, the path and the fix: never huggingface_hub's "Repo id must be
in the form ..." (a missing Orpheus `init_from` on `voxrelay plan`, or `train` on a GPU, showed it), and never a
hub request (issue 32 item 7). The examples' own configs, one key broken at a time; nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxrelay.codecs.registry import build_codec
from voxrelay.config import load_config
from voxrelay.errors import UserError, one_line
from voxrelay.models.registry import build_model
from voxrelay.plan.model import data_spec

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
# (example, key, built on meta as `plan` does too): the keys each family reads before any other source
KEYS = [
    ("orpheus-lora.yaml", "model.init_from", True), ("orpheus-lora.yaml", "model.init_from", False),
    ("demo.yaml", "model.init_from", True), ("demo.yaml", "model.init_from", False),
    ("demo.yaml", "model.tokenizer", False),
    ("vibevoice-lora.yaml", "model.init_from", False),
    ("parler-mini-v0.1.yaml", "model.init_from", True), ("parler-mini-v0.1.yaml", "model.text_encoder", False),
    ("orpheus-lora.yaml", "codec.path", False), ("parler-mini-v0.1.yaml", "codec.path", False),
]
MISSING = ["{tmp}/absent/model", "my checkpoints/orpheus"]  # the second: relative, and no hub id either


@pytest.mark.parametrize("missing", MISSING)
@pytest.mark.parametrize(("example", "key", "meta"), KEYS)
def test_a_missing_local_source_names_its_key(example, key, meta, missing, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    value = missing.format(tmp=tmp_path)
    cfg = load_config(str(EXAMPLES / example), [f"root={tmp_path / 'root'}", f"{key}={value}"])
    with pytest.raises(UserError) as info:
        if key == "codec.path":
            build_codec(cfg.codec)
        else:
            build_model(cfg.model, data_spec(cfg, None), 0, meta=meta)
    message = one_line(info.value)
    assert key in message and repr(value) in message, message
    assert "no such folder" in message or "does not exist" in message, message
    assert "Repo id" not in message, message
