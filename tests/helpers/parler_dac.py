"""Deterministic weights for parler's 44.1 kHz DAC wrapper (``parler_tts.DACModel``, descript's names), so a
test can rebuild the ~300 MB checkpoint that upstream's ``save_pretrained`` wrote from its key list alone.

Each tensor is a function of its key name only: torch's CPU generator seeded with the CRC-32 of the key draws
N(0, 1); weight-norm magnitudes (``...original0``) and Snake ``alpha``s become ``1 + 0.1 x`` (the decoder's
magnitudes half that, so its tanh output does not saturate), biases ``0.01 x``;
directions (``...original1``) and codebooks stay N(0, 1). A conv's rows then have norm ~1, so the signal keeps
its scale through the 44.1 kHz encoder. ``scripts/parler_upstream.py make-dac`` loads these into upstream's
DACModel and records what it encodes; this module is imported there too (torch only, no voxrelay).
"""

from __future__ import annotations

import zlib

import torch


def dac_tensor(key: str, shape: list[int] | tuple[int, ...]) -> torch.Tensor:
    """The float32 tensor of ``key`` (a DACModel state-dict name, e.g. ``model.encoder.block.0.bias``)."""
    noise = torch.randn(tuple(shape), generator=torch.Generator().manual_seed(zlib.crc32(key.encode())))
    if key.endswith(("original0", "weight_g")) and key.startswith("model.decoder."):
        return 0.5 * (1.0 + 0.1 * noise)  # the decoder's 12 residual units would saturate its final tanh
    if key.endswith(("original0", "weight_g", ".alpha")):
        return 1.0 + 0.1 * noise
    if key.endswith(".bias"):
        return 0.01 * noise
    return noise


def dac_state(shapes: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    """Every key of ``shapes`` (name -> shape) with its :func:`dac_tensor`."""
    return {key: dac_tensor(key, shape) for key, shape in shapes.items()}


def fixed_signal(samples: int = 4096, rate: int = 44100) -> torch.Tensor:
    """float32 [1, 1, samples]: two tones and a chirp at amplitude <= 0.9 (8 hops of 512)."""
    t = torch.arange(samples, dtype=torch.float64) / rate
    wave = 0.4 * torch.sin(2 * torch.pi * 220 * t) + 0.3 * torch.sin(2 * torch.pi * 1375 * t)
    wave = wave + 0.2 * torch.sin(2 * torch.pi * (300 + 4000 * t) * t)
    return wave.float()[None, None]


def save_dac_folder(folder, fixture, spelling: str = "dac_on_the_hub"):
    """``folder`` as upstream's ``DACModel.save_pretrained`` wrote it for ``fixture`` (tests/fixtures/parler): its
    ``config.{spelling}.json`` and the ~300 MB weights rebuilt from ``audio_encoder_keys.json``."""
    import json
    import shutil
    from pathlib import Path

    from safetensors.torch import save_file

    folder, fixture = Path(folder), Path(fixture)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(fixture / "dac" / f"config.{spelling}.json", folder / "config.json")
    keys = json.loads((fixture / "audio_encoder_keys.json").read_text())
    save_file(dac_state({k.removeprefix("audio_encoder."): v["shape"] for k, v in keys.items()}),
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
