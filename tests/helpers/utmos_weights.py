"""Seeded stand-in weights and input waves for the UTMOS check, made the same way here and by
``scripts/utmos_upstream.py`` (which feeds them to SpeechMOS' own module): each tensor of the state dict, in the
order of ``tests/fixtures/utmos/upstream.json``'s key list, drawn from one numpy generator (numpy's PCG64 gives
the same numbers on every platform and version). Imports only numpy and torch."""

from __future__ import annotations

import numpy as np
import torch

SEED = 2022
NORM = ("norm", "layer_norm", "conv_layers.0.2.")  # 1-D weights of these layers start near 1, as in training


def stand_in_weights(shapes: list[tuple[str, list[int]]]) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(SEED)
    out = {}
    for key, shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 1 and key.endswith("weight") and any(n in key for n in NORM):
            x = 1 + 0.1 * x
        elif key.endswith("weight_g") or key.endswith("original0"):
            x = 1 + 0.1 * np.abs(x)
        else:
            x = 0.05 * x
        out[key] = torch.from_numpy(x)
    return out


def waves(rate: int = 16_000) -> list[np.ndarray]:
    """Two clips with speech-like harmonics and noise: 1.30 s and 0.91 s (an odd and an even wav2vec2 frame
    count: SpeechMOS pads odd counts to even and masks the pad)."""
    rng = np.random.default_rng(SEED + 1)
    out = []
    for seconds, f0 in ((1.30, 140.0), (0.91, 210.0)):
        t = np.arange(int(seconds * rate)) / rate
        voiced = sum(np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 6.3)) / k for k in range(1, 8))
        out.append((0.1 * voiced * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t)) + 0.01 * rng.standard_normal(len(t)))
                   .astype(np.float32))
    return out
