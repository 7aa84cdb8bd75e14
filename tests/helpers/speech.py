"""Clean English speech for scoring tests: eSpeak NG through the demo corpus's synthesiser."""

from __future__ import annotations

import numpy as np

from voxrelay.data.demo_corpus import load_synthesizer

SENTENCES = [
    "Mara painted the yellow lantern near the station.",
    "Did Felix carry the heavy ladder behind the library?",
    "The kettle was broken, so the baker laughed.",
    "Nadia said the ticket costs forty two coins.",
    "How many candles did Oskar count last winter?",
    "Why did the pilot hide the muddy scarf at dawn?",
]


def espeak(text: str, voice: str = "en-us", rate: int = 160) -> tuple[np.ndarray, int]:
    """(float32 mono audio in [-1, 1], sample rate) of ``text`` spoken by eSpeak NG ``voice``."""
    wav, sr = load_synthesizer().synth(text, voice, rate, 0)
    return np.asarray(wav, dtype=np.float32) / 32768.0, sr
