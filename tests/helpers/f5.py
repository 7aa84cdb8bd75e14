"""Tiny stand-ins of F5-TTS' parts (no download): a Vocos folder laid out as the hub's charactr/vocos-mel-24khz
(config.yaml + model.safetensors) with the tiny weights scripts/vocos_reference.py recorded from upstream vocos, and
the sizes of a random F5 DiT small enough for a CPU test."""

from __future__ import annotations

import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "f5"
TINY_F5 = {"dim": 64, "depth": 2, "heads": 2, "ff_mult": 2, "text_dim": 32, "conv_layers": 1}


def save_tiny_vocos(folder: Path) -> Path:
    from safetensors.torch import load_file, save_file

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / "vocos_config.yaml", folder / "config.yaml")
    weights = {k: v for k, v in load_file(str(FIXTURES / "vocos_reference.safetensors")).items()
               if not k.startswith("io.")}
    save_file(weights, str(folder / "model.safetensors"))
    return folder
