"""The demo source's ``layout: dialogues``: two-speaker dialogues in the folder layout of seed 003.

::

    audio/d00000.wav   the dialogue (turns 0.3 s apart)      text/d00000.txt   one turn per line:
    audio/s00001.wav   one speaker alone (a voice prompt)                      [SPEAKER_A] ...
    metadata.csv       id,audio_path,text_path,num_speakers,duration_sec,speaker

Dialogues of 2-4 alternating turns between two voices of ``voices`` (the pairs taken in turn) alternate
with one-sentence segments of a single voice; a row's ``speaker`` names its voices in tag order
(``en-us,en-gb+f3`` for ``[SPEAKER_A]``, ``[SPEAKER_B]``), so a family can find another segment of the
same voice. Written by :func:`voxrelay.data.demo_corpus.generate_demo_corpus` (same arguments, same bytes).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from voxrelay.data.audio import resample, trim_silence, write_wav
from voxrelay.data.demo_text import SentenceMaker

GAP_SECONDS = 0.3
TAGS = "AB"


def write_dialogues(folder: Path, params: dict, synth, base_rate: int, metadata: str) -> tuple[int, float]:
    """Synthesise dialogues and single-voice segments until ``params["minutes"]`` of audio exist in
    ``folder``; returns (rows, seconds)."""
    voices, sr_out = params["voices"], params["sample_rate"]
    if len(voices) < 2:
        raise ValueError(f"layout dialogues needs at least 2 voices, got {voices}")
    rng = np.random.default_rng(params["seed"])
    maker = SentenceMaker(np.random.default_rng([params["seed"], 1]))
    rates = {v: base_rate + int(rng.integers(-10, 11)) for v in voices}

    def say(text: str, voice: str) -> np.ndarray:
        pcm, sr = synth.synth(text, voice, rates[voice] + int(rng.integers(-8, 9)), seed=int(rng.integers(2**31)))
        wav = trim_silence(pcm.astype(np.float32) / 32768.0, sr)
        if wav.size == 0:
            raise ValueError(f"{synth.name} returned no audio for voice {voice!r}; try another voice")
        return resample(wav, sr, sr_out)

    target_s, total_s, rows = params["minutes"] * 60.0, 0.0, []
    while total_s < target_s:
        i = len(rows)
        pair = [voices[(i // 2) % len(voices)], voices[(i // 2 + 1) % len(voices)]]
        if i % 2 == 0:  # a dialogue
            turns = [(t % 2, maker.sentence()) for t in range(int(rng.integers(2, 5)))]
            gap = np.zeros(int(GAP_SECONDS * sr_out), dtype=np.float32)
            parts = [x for who, text in turns for x in (say(text, pair[who]), gap)][:-1]
            utt_id, speakers = f"d{i:05d}", pair
        else:  # one voice alone
            turns = [(0, maker.sentence())]
            parts = [say(turns[0][1], pair[0])]
            utt_id, speakers = f"s{i:05d}", [pair[0]]
        wav = np.concatenate(parts)
        write_wav(folder / "audio" / f"{utt_id}.wav", wav, sr_out)
        (folder / "text").mkdir(parents=True, exist_ok=True)
        (folder / "text" / f"{utt_id}.txt").write_text("".join(f"[SPEAKER_{TAGS[w]}] {t}\n" for w, t in turns))
        seconds = wav.shape[0] / sr_out
        rows.append((utt_id, f"audio/{utt_id}.wav", f"text/{utt_id}.txt", len(speakers), f"{seconds:.3f}",
                     ",".join(speakers)))
        total_s += seconds
    with open(folder / metadata, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["id", "audio_path", "text_path", "num_speakers", "duration_sec", "speaker"])
        writer.writerows(rows)
    return len(rows), total_s
