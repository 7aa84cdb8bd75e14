"""Builders of small on-disk datasets (good and broken rows) for data-pipeline tests.

``make_folder_dataset(tmp_path)`` writes a ``metadata.csv`` corpus in the user's layout
(``audio/*.wav`` + ``text/*.txt``) with :data:`GOOD_ROWS` and one row of each kind of breakage;
:data:`EXPECTED_REASONS` maps each bad id to a substring of the reason voxrelay must give.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf


def sine(seconds: float, sample_rate: int = 16000, freq: float = 220.0, channels: int = 1) -> np.ndarray:
    """A 0.3-amplitude sine: float32 ``[N]`` (or ``[N, C]`` when channels > 1)."""
    t = np.arange(int(round(seconds * sample_rate)), dtype=np.float64) / sample_rate
    wav = (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return wav if channels == 1 else np.stack([wav] * channels, axis=1)


def make_wav(
    path: str | Path,
    seconds: float = 1.0,
    sample_rate: int = 16000,
    *,
    freq: float = 220.0,
    channels: int = 1,
    nan: bool = False,
) -> Path:
    """Write a sine WAV (16-bit PCM, or 32-bit float when ``nan`` puts NaNs in it); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    wav = sine(seconds, sample_rate, freq, channels)
    if nan:
        wav[len(wav) // 2 : len(wav) // 2 + 10] = np.nan  # only a float WAV can carry NaN
    sf.write(str(p), wav, sample_rate, subtype="FLOAT" if nan else "PCM_16")
    return p


def wav_bytes(seconds: float = 1.0, sample_rate: int = 16000, freq: float = 220.0) -> bytes:
    """The bytes of a 16-bit PCM WAV file holding a sine."""
    import io

    buf = io.BytesIO()
    sf.write(buf, sine(seconds, sample_rate, freq), sample_rate, subtype="PCM_16", format="WAV")
    return buf.getvalue()


@dataclass
class Row:
    """One row of a folder corpus and how to break it.

    ``seconds=None`` writes no audio file; ``text=None`` writes no text file. ``audio_path`` /
    ``text_path`` override the default ``audio/<id>.wav`` / ``text/<id>.txt`` written in the CSV.
    """

    id: str
    text: str | None = "Hello there."
    seconds: float | None = 1.0
    sample_rate: int = 16000
    corrupt: bool = False
    nan: bool = False
    audio_path: str | None = None
    text_path: str | None = None
    num_speakers: int = 1
    channels: int = 1


GOOD_ROWS = [
    Row("d001", "[SPEAKER_A] Good morning.\n[SPEAKER_B] Morning to you.", 1.2, num_speakers=2),
    Row("d002", "The kettle is on the stove.", 0.9, sample_rate=24000),
    Row("d003", "A third clip, in stereo at 22 kHz.", 1.5, sample_rate=22050, channels=2),
]
BAD_ROWS = [
    Row("bad-missing-audio", "No audio file.", seconds=None),
    Row("bad-corrupt", "Corrupt bytes.", corrupt=True),
    Row("bad-empty-text", "   \n"),
    Row("bad-nan", "NaN samples.", nan=True),
    Row("bad-too-long", "Far too long.", seconds=3.0),
    Row("bad-traversal", "Escapes.", audio_path="../../etc/passwd"),
    Row("bad-absolute", "Absolute outside.", audio_path="/etc/passwd"),
    Row("bad-missing-text", None),
]
# substrings of the reasons, for a corpus read with max_duration=2.5 s (see make_folder_dataset)
EXPECTED_REASONS = {
    "bad-missing-audio": "audio file missing",
    "bad-corrupt": "unreadable or corrupt audio file",
    "bad-empty-text": "empty text",
    "bad-nan": "NaN/inf samples",
    "bad-too-long": "too long: 3.00 s > data.max_duration 2.5 s",
    "bad-traversal": "outside the dataset folder",
    "bad-absolute": "outside the dataset folder",
    "bad-missing-text": "text file missing",
}
MAX_DURATION = 2.5


def make_folder_dataset(root: str | Path, rows: list[Row] | None = None, *, inline_text: bool = False) -> Path:
    """Write a ``metadata.csv`` corpus in ``root`` (created); ``rows`` defaults to good + bad rows.

    Header ``id,audio_path,text_path,num_speakers,duration_sec`` with paths relative to ``root``,
    or ``id,audio_path,text`` when ``inline_text``. Returns ``root``.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows = GOOD_ROWS + BAD_ROWS if rows is None else rows
    header = ["id", "audio_path", "text"] if inline_text else ["id", "audio_path", "text_path", "num_speakers",
                                                               "duration_sec"]  # fmt: skip
    with open(root / "metadata.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for r in rows:
            audio_rel = r.audio_path or f"audio/{r.id}.wav"
            if r.corrupt:
                (root / audio_rel).parent.mkdir(parents=True, exist_ok=True)
                (root / audio_rel).write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt garbage, not audio")
            elif r.seconds is not None and r.audio_path is None:
                make_wav(root / audio_rel, r.seconds, r.sample_rate, channels=r.channels, nan=r.nan)
            text_rel = r.text_path or f"text/{r.id}.txt"
            if r.text is not None and not inline_text:
                (root / text_rel).parent.mkdir(parents=True, exist_ok=True)
                (root / text_rel).write_text(r.text, encoding="utf-8")
            if inline_text:
                writer.writerow([r.id, audio_rel, r.text or ""])
            else:
                writer.writerow([r.id, audio_rel, text_rel, r.num_speakers, r.seconds or ""])
    return root


def make_ljspeech_dataset(root: str | Path, n: int = 3, seconds: float = 1.0) -> Path:
    """LJSpeech layout: ``metadata.csv`` (``id|text|normalized_text``) + ``wavs/<id>.wav``."""
    root = Path(root)
    lines = []
    for i in range(n):
        make_wav(root / "wavs" / f"LJ001-{i:04d}.wav", seconds, 22050)
        lines.append(f"LJ001-{i:04d}|Chapter {i + 1}, Dr. Smith.|Chapter {i + 1}, Doctor Smith.")
    lines.append("LJ001-9999|Only raw text.|")  # no normalised text: the raw text is used
    lines.append("LJ001-8888||")  # empty text
    make_wav(root / "wavs" / "LJ001-9999.wav", seconds, 22050)
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def make_jsonl_dataset(root: str | Path, n: int = 3) -> Path:
    """``root/data/train.jsonl`` with ``n`` good rows (audio in ``root/data/clips``) + broken ones."""
    folder = Path(root) / "data"
    records = []
    for i in range(n):
        make_wav(folder / "clips" / f"c{i}.wav", 0.8, 16000)
        records.append({"id": f"j{i}", "audio": f"clips/c{i}.wav", "text": f"Line {i}.", "speaker": f"s{i % 2}",
                        "description": "a calm voice"})  # fmt: skip
    records.append({"id": "j-empty", "audio": "clips/c0.wav", "text": ""})
    records.append({"id": "j-escape", "audio": "../../secret.wav", "text": "Out."})
    records.append({"id": "j-noaudio", "text": "No audio field."})
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path
