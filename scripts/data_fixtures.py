#!/usr/bin/env python3
"""Fixtures of the dataset layouts users bring to `voxrelay prepare`, made by the upstream tools.

    .venv/bin/python scripts/data_fixtures.py [--out tests/fixtures/data]

Writes, under --out (each folder small: a few short clips):

- ``ljspeech/``: LJSpeech 1.1's layout as its README (keithito.com/LJ-Speech-Dataset) specifies it:
  ``metadata.csv``, one record per line, fields ``ID|Transcription|Normalized Transcription`` delimited by the
  pipe character (0x7c), no header, UTF-8; ``wavs/<ID>.wav`` single-channel 16-bit PCM WAV at 22050 Hz. The four
  records are LJSpeech's own lines (LJ001-0001, -0002, -0007, -0045), two of them with numbers that only the
  normalized column spells out and one with double quotes; the clips are short tones (LJSpeech's audio is
  ~24 h), written by soundfile in LJSpeech's format.
- ``hf_common_voice/``: a ``datasets.Dataset.save_to_disk`` folder written by HF ``datasets`` itself with
  Common Voice's column names (``client_id``, ``path``, ``audio``, ``sentence``, ``up_votes``, ``down_votes``,
  ``age``, ``gender``, ``accent``, ``locale``, ``segment``), not voxrelay's defaults; audio embedded by the
  ``Audio`` feature.
- ``hf_orpheus/``: the layout Orpheus' fine-tuning expects (canopyai/Orpheus-TTS README "Finetune Model", and
  unslothai/notebooks ``nb/Orpheus_(3B)-TTS.ipynb``: "**text, audio** for single-speaker models or **source,
  text, audio** for multi-speaker models", prompt ``f"{source}: {text}"``), as ``load_dataset(...)`` returns it
  (a ``DatasetDict`` with a ``train`` split) saved with ``save_to_disk``; 24 kHz audio (SNAC's rate) in an
  ``Audio`` feature, emotion tags in the text as in MrDragonFox/Elise.

Rerunning it rewrites the folders (the ``datasets`` fingerprints in ``state.json`` change, the rows do not).
Not part of the package install and not run by CI.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "data"

# LJSpeech 1.1 metadata.csv, verbatim (ID|Transcription|Normalized Transcription)
LJSPEECH_LINES = [
    "LJ001-0001|Printing, in the only sense with which we are at present concerned, differs from most if not from "
    "all the arts and crafts represented in the Exhibition|Printing, in the only sense with which we are at present "
    "concerned, differs from most if not from all the arts and crafts represented in the Exhibition",
    "LJ001-0002|in being comparatively modern.|in being comparatively modern.",
    'LJ001-0007|the earliest book printed with movable types, the Gutenberg, or "forty-two line Bible" of about 1455,|'
    'the earliest book printed with movable types, the Gutenberg, or "forty-two line Bible" of about fourteen '
    "fifty-five,",
    "LJ001-0045|1469, 1470;|fourteen sixty-nine, fourteen seventy;",
]
COMMON_VOICE = [  # (client_id, path, sentence, gender)
    ("5e1c0a8f", "common_voice_en_19001.mp3", "The museum opens at nine.", "female_feminine"),
    ("9b77d2c4", "common_voice_en_19002.mp3", "Bring the blue umbrella with you.", "male_masculine"),
    ("5e1c0a8f", "common_voice_en_19003.mp3", "Rain is expected after lunch.", "female_feminine"),
]
ORPHEUS = [  # (source, text)
    ("tara", "Hey there, I'm Tara. <laughs> Nice to finally meet you."),
    ("leo", "The train leaves at six, so don't be late."),
    ("tara", "Honestly, I think <sigh> we should start over."),
]


def tone(seconds: float, rate: int, freq: float) -> np.ndarray:
    t = np.arange(int(round(seconds * rate))) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def wav_bytes(wav: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, wav, rate, subtype="PCM_16", format="WAV")
    return buf.getvalue()


def make_ljspeech(out: Path) -> None:
    (out / "wavs").mkdir(parents=True)
    for i, line in enumerate(LJSPEECH_LINES):
        sf.write(out / "wavs" / f"{line.split('|')[0]}.wav", tone(0.35, 22050, 180.0 + 30 * i), 22050,
                 subtype="PCM_16")
    (out / "metadata.csv").write_bytes(("\n".join(LJSPEECH_LINES) + "\n").encode("utf-8"))


def make_common_voice(out: Path) -> str:
    import datasets

    rows = {"client_id": [], "path": [], "audio": [], "sentence": [], "up_votes": [], "down_votes": [], "age": [],
            "gender": [], "accent": [], "locale": [], "segment": []}
    for i, (client, path, sentence, gender) in enumerate(COMMON_VOICE):
        for key, value in (("client_id", client), ("path", path), ("sentence", sentence), ("up_votes", 2),
                           ("down_votes", 0), ("age", "thirties"), ("gender", gender), ("accent", ""),
                           ("locale", "en"), ("segment", "")):
            rows[key].append(value)
        rows["audio"].append({"bytes": wav_bytes(tone(0.3, 16000, 200.0 + 40 * i), 16000), "path": path})
    ds = datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio(sampling_rate=16000))
    ds.save_to_disk(str(out))
    return datasets.__version__


def make_orpheus(out: Path) -> None:
    import datasets

    rows = {"source": [s for s, _ in ORPHEUS], "text": [t for _, t in ORPHEUS],
            "audio": [{"bytes": wav_bytes(tone(0.3, 24000, 220.0 + 50 * i), 24000), "path": None}
                      for i in range(len(ORPHEUS))]}
    ds = datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio(sampling_rate=24000))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(out))


README = """# Dataset layouts users bring (generated, do not edit)

Made by `.venv/bin/python scripts/data_fixtures.py` (repo root) with HF `datasets` {datasets} and soundfile
{soundfile} (Python {python}); its docstring says where each layout is specified. Rerunning it reproduces the rows.

- `ljspeech/` (written by the script to LJSpeech 1.1's README): `metadata.csv` with
  `ID|Transcription|Normalized Transcription` (LJSpeech's own lines LJ001-0001, -0002, -0007, -0045) and
  `wavs/<ID>.wav`, 16-bit mono 22050 Hz (0.35 s tones). voxrelay: `type: ljspeech`.
- `hf_common_voice/` (`datasets.Dataset.save_to_disk`): Common Voice's columns `client_id`, `path`, `audio`
  (Audio, embedded 16 kHz WAV), `sentence`, `up_votes`, ... voxrelay: `type: hf`, `text_column: sentence`,
  `speaker_column: client_id`, `id_column: path`.
- `hf_orpheus/` (`datasets.DatasetDict.save_to_disk`): Orpheus fine-tuning's `source`, `text`, `audio` (Audio,
  embedded 24 kHz WAV), split `train`. voxrelay: `type: hf`, `speaker_column: source`.
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    for name in ("ljspeech", "hf_common_voice", "hf_orpheus"):
        shutil.rmtree(args.out / name, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    make_ljspeech(args.out / "ljspeech")
    version = make_common_voice(args.out / "hf_common_voice")
    make_orpheus(args.out / "hf_orpheus")
    (args.out / "README.md").write_text(README.format(datasets=version, soundfile=sf.__version__,
                                                      python=sys.version.split()[0]))
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
