#!/usr/bin/env python3
"""Golden inputs of XCodec2 / NeuCodec, computed by transformers' own feature extractors with torchaudio's own
``compliance/kaldi.py``, for ``tests/unit/codecs/test_xcodec_features.py``.

    .venv/bin/python scripts/xcodec_features_golden.py [--wheel torchaudio-2.11.0-...whl] [--out FILE]

No torchaudio wheel exists for the torch this project runs (the newest, 2.11.0, pins torch 2.11), and the
extractors need it only for ``torchaudio.compliance.kaldi.fbank``, a pure-torch function. So the script downloads
that wheel (``pip download --no-deps torchaudio==2.11.0``, or takes ``--wheel``), puts its ``kaldi.py`` alone in a
stand-in ``torchaudio`` package on ``sys.path`` (transformers only checks that the module can be found), and runs
``Xcodec2FeatureExtractor`` / ``NeuCodecFeatureExtractor`` (``sampling_rate=16000``) on fixed signals. It records
each one's ``input_values`` length and its ``input_features`` (each float32 as the shortest decimal that reads
back as the same float32).

Not part of the package install and not run by CI.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "xcodec_features_golden.json"
LENGTHS = (1, 319, 320, 641, 1000, 1600)  # NeuCodec's extractor refuses fewer than 320 samples (fbank of < 400)
TORCHAUDIO = "torchaudio==2.11.0"


def signal(n: int) -> np.ndarray:
    """A chirp plus seeded noise, float32 [n] in (-0.5, 0.5): what the test regenerates."""
    t = np.arange(n) / 16000
    rng = np.random.default_rng(n)
    return (0.3 * np.sin(2 * np.pi * (200 + 900 * t) * t) + 0.05 * rng.standard_normal(n)).astype(np.float32)


def standin_torchaudio(wheel: Path | None, folder: Path) -> str:
    """A ``torchaudio`` package holding only the wheel's ``compliance/kaldi.py``; returns the wheel's name."""
    if wheel is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(folder), TORCHAUDIO],
                       check=True)
        wheel = next(folder.glob("torchaudio-*.whl"))
    package = folder / "standin" / "torchaudio"
    (package / "compliance").mkdir(parents=True)
    with zipfile.ZipFile(wheel) as whl:
        (package / "compliance" / "kaldi.py").write_bytes(whl.read("torchaudio/compliance/kaldi.py"))
    (package / "__init__.py").write_text("from . import compliance\n")
    (package / "compliance" / "__init__.py").write_text("from . import kaldi\n")
    sys.path.insert(0, str(folder / "standin"))
    return wheel.name


def record(name: str) -> dict:
    import transformers

    extractor = getattr(transformers, name)()
    cases = []
    for n in LENGTHS:
        try:
            out = extractor(signal(n), sampling_rate=16000, return_tensors="np")
        except AssertionError as e:  # kaldi's check that the signal holds one 400-sample window
            cases.append({"samples": n, "error": str(e)})
            continue
        feats = out["input_features"][0].astype(np.float32)
        cases.append({"samples": n, "input_values": int(out["input_values"].shape[-1]),
                      "input_features_mask": out["input_features_mask"][0].tolist(),
                      "input_features": [[float(str(v)) for v in row] for row in feats]})
    return {"extractor": name, "cases": cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wheel", type=Path, default=None, help="a downloaded torchaudio wheel")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = standin_torchaudio(args.wheel, Path(tmp))
        import transformers

        golden = {"made_by": f"scripts/xcodec_features_golden.py: transformers {transformers.__version__}, "
                              f"kaldi.py of {wheel}",
                  "extractors": [record("Xcodec2FeatureExtractor"), record("NeuCodecFeatureExtractor")]}
    args.out.write_text(json.dumps(golden) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
