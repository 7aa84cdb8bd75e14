#!/usr/bin/env python3
"""Reference scores from SpeechMOS' own UTMOS22 strong module (tarepan/SpeechMOS v1.2.0), for
``tests/unit/quality/test_utmos.py``: voxrelay's UTMOS (``voxrelay.quality.utmos``) loads the same weights under
SpeechMOS' names and must give the same scores.

    python3 scripts/utmos_upstream.py --upstream DIR [--layers 2] [--out tests/fixtures/utmos/upstream.json]

DIR: a checkout of https://github.com/tarepan/SpeechMOS at v1.2.0 (``git clone --branch v1.2.0 ...``). Nothing of
voxrelay is imported: the module runs from DIR in this interpreter (any Python with torch and numpy). SpeechMOS
imports torchaudio only to resample; the clips here are at 16 kHz, where its resample returns its input, so a stub
that does exactly that stands in for it (no CPU torchaudio build matches torch 2.13).

The upstream model is built whole, then its encoder is cut to ``--layers`` transformer layers (its forward loops
over the layer list; 12 in the released weights) to keep the check small. Every tensor of its state dict is then
replaced by seeded numbers (tests/helpers/utmos_weights.py), loaded with load_state_dict, and two clips scored.
Written: the state dict's names and shapes in upstream's order, and the scores. Not run by CI.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _stub_torchaudio() -> None:
    def resample(wave, orig_freq, new_freq):
        if orig_freq != new_freq:
            raise RuntimeError("the torchaudio stub only passes 16 kHz clips through")
        return wave

    ta = types.ModuleType("torchaudio")
    ta.functional = types.SimpleNamespace(resample=resample)
    sys.modules["torchaudio"] = ta


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, type=Path, help="a checkout of tarepan/SpeechMOS v1.2.0")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "tests/fixtures/utmos/upstream.json")
    args = parser.parse_args()
    _stub_torchaudio()
    sys.path.insert(0, str(args.upstream))
    import torch
    from speechmos.utmos22.strong.model import UTMOS22Strong

    spec = importlib.util.spec_from_file_location("utmos_weights", ROOT / "tests/helpers/utmos_weights.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)

    model = UTMOS22Strong()
    model.wav2vec2.encoder.layers = model.wav2vec2.encoder.layers[:args.layers]
    shapes = [(k, list(v.shape)) for k, v in model.state_dict().items()]
    model.load_state_dict(recipe.stand_in_weights(shapes))
    model.eval()
    with torch.inference_mode():
        scores = [float(model(torch.from_numpy(w)[None], 16_000)[0]) for w in recipe.waves()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "made_by": "scripts/utmos_upstream.py: tarepan/SpeechMOS v1.2.0 UTMOS22Strong, encoder cut to "
                   f"{args.layers} layers, seeded weights (tests/helpers/utmos_weights.py), torch {torch.__version__}",
        "layers": args.layers, "shapes": shapes, "scores": scores}, indent=1) + "\n")
    print(f"{args.out}: {len(shapes)} tensors, scores {scores}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
