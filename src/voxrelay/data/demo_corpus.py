"""A generated multi-speaker corpus so that ``voxrelay`` runs end to end with no download.

Sentences come from a small grammar and word lists of our own (``demo_text``); speech comes from
eSpeak NG, one voice (voice+variant, e.g. ``"en-gb+f3"``) per speaker. The corpus folder holds
``metadata.csv`` (``id,audio_path,text,speaker``), ``wavs/*.wav`` (16-bit mono) and ``DONE``,
written last. The same arguments give the same files, byte for byte.

Backends, tried in order: the ``espeakng-loader`` wheel (libespeak-ng driven through ctypes),
then an ``espeak-ng`` binary on PATH.
"""

from __future__ import annotations

import csv
import ctypes
import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Protocol

import numpy as np

from voxrelay.data.audio import load_audio, resample, trim_silence, write_wav
from voxrelay.data.demo_text import SentenceMaker
from voxrelay.errors import UserError

DEFAULT_VOICES = ["en-us", "en-gb+f3", "en-us+m3", "en-gb-scotland+f2"]
DONE_MARKER = "DONE"
METADATA = "metadata.csv"
_BASE_RATE = 165  # eSpeak words per minute; its default is 175, a little slower is easier to learn

_INSTALL_HINT = "install it with `pip install espeakng-loader` or `apt-get install espeak-ng`"
_LIST_VOICES_HINT = "`voxrelay demo --list-voices` lists the languages"


class SynthesisError(UserError, RuntimeError):
    """eSpeak NG is unavailable or rejected a voice; the message says how to fix it."""


class DemoCorpusError(UserError, ValueError):
    """The corpus folder cannot be used (made with other arguments, or not a demo corpus)."""


def unknown_voice_message(voice: str, languages: list[str]) -> str:
    """What to tell a user whose ``voice`` eSpeak NG rejects; ``languages``: the known ones (may be empty)."""
    language = voice.partition("+")[0]
    close = difflib.get_close_matches(language, languages, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    return (
        f"eSpeak NG has no voice {voice!r} (a voice of the demo source, data.sources: [{{type: demo, voices: "
        "[...]}]); a voice is a language with an optional variant such as +m3 or +f2, e.g. 'en-us', "
        f"'en-gb+f3', 'en-us+m3', 'en-gb-scotland+f2'; {hint}{_LIST_VOICES_HINT}"
    )


class Synthesizer(Protocol):
    name: str

    def synth(self, text: str, voice: str, rate: int, seed: int) -> tuple[np.ndarray, int]:
        """Speak ``text`` at ``rate`` words/min -> (int16 samples ``[N]``, sample rate in Hz)."""
        ...

    def languages(self) -> list[str]:
        """The language tags of the installed voices."""
        ...


class _EspeakVoice(ctypes.Structure):
    # espeak_VOICE from speak_lib.h
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_char_p),
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


_SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_PARAM_RATE = 1

# libespeak-ng keeps global state (one voice, one callback): one lock and one instance per process.
_LIB_LOCK = threading.Lock()
_LIB_INSTANCE: _EspeakLibrary | None = None


class _EspeakLibrary:
    """libespeak-ng from the ``espeakng-loader`` wheel, in synchronous (retrieval) mode."""

    name = "espeakng-loader"

    def __init__(self, lib: ctypes.CDLL, sample_rate: int) -> None:
        self.lib = lib
        self.sample_rate = sample_rate
        self.chunks: list[np.ndarray] = []
        self.callback = _SYNTH_CALLBACK(self._collect)  # kept referenced: the C side calls it

    @classmethod
    def instance(cls) -> _EspeakLibrary:
        """Load and initialise the library once per process (raises OSError/RuntimeError/ImportError)."""
        global _LIB_INSTANCE
        with _LIB_LOCK:
            if _LIB_INSTANCE is None:
                import espeakng_loader

                lib = ctypes.CDLL(espeakng_loader.get_library_path())
                lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
                lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
                lib.espeak_SetVoiceByProperties.argtypes = [ctypes.POINTER(_EspeakVoice)]
                lib.espeak_GetCurrentVoice.restype = ctypes.POINTER(_EspeakVoice)
                lib.espeak_ListVoices.argtypes = [ctypes.POINTER(_EspeakVoice)]
                lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_EspeakVoice))
                lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
                lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
                lib.espeak_Synth.argtypes = [
                    ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                    ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                ]  # fmt: skip
                data = espeakng_loader.get_data_path().encode()
                sr = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data, _INITIALIZE_DONT_EXIT)
                if sr <= 0:
                    raise RuntimeError(f"espeak_Initialize failed (returned {sr}) with data at {data.decode()}")
                inst = cls(lib, sr)
                lib.espeak_SetSynthCallback(inst.callback)
                _LIB_INSTANCE = inst
            return _LIB_INSTANCE

    def _collect(self, wav, num_samples, events) -> int:  # noqa: ANN001 (ctypes callback)
        if wav and num_samples > 0:
            self.chunks.append(np.ctypeslib.as_array(wav, shape=(num_samples,)).copy())
        return 0  # 0 = continue synthesis

    def _select_voice(self, voice: str) -> None:
        if self.lib.espeak_SetVoiceByName(voice.encode()) == 0:
            return
        # Language tags such as "en-gb" are not voice names in espeak-ng 1.52 (the CLI falls back to
        # a language lookup); do the same, then re-attach the variant to the found voice identifier.
        language, _, variant = voice.partition("+")
        query = _EspeakVoice(languages=language.encode())
        if self.lib.espeak_SetVoiceByProperties(ctypes.byref(query)) == 0:
            identifier = self.lib.espeak_GetCurrentVoice().contents.identifier
            name = identifier.decode() + (f"+{variant}" if variant else "")
            if identifier and self.lib.espeak_SetVoiceByName(name.encode()) == 0:
                return
        raise SynthesisError(unknown_voice_message(voice, self.languages()))

    def languages(self) -> list[str]:
        """The language tags of the installed voices (each usable as a voice, with or without +variant)."""
        voices = self.lib.espeak_ListVoices(None)  # NULL-terminated array of espeak_VOICE*
        tags, i = set(), 0
        while voices[i]:
            # ``languages`` is a list of (priority byte, NUL-terminated tag) ending with a 0 byte; read as a
            # C string it stops at the first tag's NUL: the priority byte, then the voice's own language.
            raw = voices[i].contents.languages or b""
            if len(raw) > 1:
                tags.add(raw[1:].decode())
            i += 1
        return sorted(tags)

    def synth(self, text: str, voice: str, rate: int, seed: int) -> tuple[np.ndarray, int]:
        with _LIB_LOCK:
            self._select_voice(voice)
            self.lib.espeak_SetParameter(_PARAM_RATE, int(rate), 0)
            # breathy variants (+f2, +f3...) add noise from an RNG seeded differently per process
            self.lib.espeak_ng_SetRandSeed(int(seed))
            self.chunks = []
            data = text.encode("utf-8")
            err = self.lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
            if err != 0:
                raise SynthesisError(f"espeak_Synth failed with code {err} for text {text!r}")
            chunks, self.chunks = self.chunks, []
        wav = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
        return wav.astype(np.int16, copy=False), self.sample_rate


class _EspeakBinary:
    """An ``espeak-ng`` (or ``espeak``) executable on PATH; one process per sentence."""

    name = "espeak-ng binary"

    def __init__(self, exe: str) -> None:
        self.exe = exe

    def synth(self, text: str, voice: str, rate: int, seed: int) -> tuple[np.ndarray, int]:
        # the binary cannot be seeded: breathy variants (+f2, +f3...) differ from run to run
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.wav"
            proc = subprocess.run(
                [self.exe, "-v", voice, "-s", str(int(rate)), "-w", str(out), text],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if proc.returncode != 0 or not out.is_file():
                raise SynthesisError(
                    f"{self.exe} -v {voice} failed ({' '.join(proc.stderr.split())[:200]}); "
                    f"check the voice name: {_LIST_VOICES_HINT}"
                )
            wav, sr = load_audio(out)
        return (np.clip(wav, -1.0, 1.0) * 32767.0).round().astype(np.int16), sr

    def languages(self) -> list[str]:
        """The language tags of ``espeak-ng --voices`` (its second column)."""
        proc = subprocess.run([self.exe, "--voices"], capture_output=True, text=True, timeout=60)
        rows = [line.split() for line in proc.stdout.splitlines()[1:]]  # the first line is the header
        return sorted({row[1] for row in rows if len(row) > 1})


def load_synthesizer() -> Synthesizer:
    """The first working eSpeak NG backend; raises :class:`SynthesisError` when there is none."""
    reasons = []
    try:
        return _EspeakLibrary.instance()
    except (ImportError, OSError, RuntimeError, AttributeError) as e:
        reasons.append(f"espeakng-loader: {e}")
    for exe in ("espeak-ng", "espeak"):
        path = shutil.which(exe)
        if path:
            return _EspeakBinary(path)
    reasons.append("no espeak-ng binary on PATH")
    raise SynthesisError(f"eSpeak NG is not available ({'; '.join(reasons)}); {_INSTALL_HINT}")


def list_voices() -> list[str]:
    """The language tags eSpeak NG knows here: each is a voice, alone or with a variant (``en-gb+f3``)."""
    return load_synthesizer().languages()


def _params(minutes: float, voices: list[str], seed: int, sample_rate: int, layout: str = "sentences") -> dict:
    params = {"minutes": float(minutes), "voices": list(voices), "seed": int(seed), "sample_rate": int(sample_rate)}
    return params if layout == "sentences" else params | {"layout": layout}  # older corpora stay reusable


def _write_corpus(folder: Path, params: dict) -> dict:
    """Synthesise sentences round-robin over the voices until ``minutes`` of audio exist in ``folder``."""
    synth = load_synthesizer()
    if params.get("layout") == "dialogues":
        from voxrelay.data.demo_dialogues import write_dialogues

        try:
            count, total_s = write_dialogues(folder, params, synth, _BASE_RATE, METADATA)
        except ValueError as e:
            raise SynthesisError(str(e)) from None
        summary = {**params, "utterances": count, "seconds": round(total_s, 3), "backend": synth.name}
        (folder / DONE_MARKER).write_text(json.dumps(summary, indent=1) + "\n")  # the commit marker: last
        return summary
    voices, sr_out = params["voices"], params["sample_rate"]
    rng = np.random.default_rng(params["seed"])
    maker = SentenceMaker(np.random.default_rng([params["seed"], 1]))
    base_rates = {v: _BASE_RATE + int(rng.integers(-10, 11)) for v in voices}  # a per-seed speaking style
    target_s, total_s, rows = params["minutes"] * 60.0, 0.0, []
    while total_s < target_s:
        i = len(rows)
        voice = voices[i % len(voices)]  # round-robin: every speaker present even in a tiny corpus
        text = maker.sentence()
        rate = base_rates[voice] + int(rng.integers(-8, 9))
        pcm, sr = synth.synth(text, voice, rate, seed=int(rng.integers(2**31)))
        wav = trim_silence(pcm.astype(np.float32) / 32768.0, sr)
        if wav.size == 0:
            raise SynthesisError(f"{synth.name} returned no audio for voice {voice!r}; try another voice")
        wav = resample(wav, sr, sr_out)
        utt_id = f"demo-{i:05d}"
        write_wav(folder / "wavs" / f"{utt_id}.wav", wav, sr_out)
        rows.append((utt_id, f"wavs/{utt_id}.wav", text, voice))
        total_s += wav.shape[0] / sr_out
    with open(folder / METADATA, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["id", "audio_path", "text", "speaker"])
        writer.writerows(rows)
    summary = {**params, "utterances": len(rows), "seconds": round(total_s, 3), "backend": synth.name}
    (folder / DONE_MARKER).write_text(json.dumps(summary, indent=1) + "\n")  # the commit marker: last
    return summary


_SYNTHESIS_FAILED = 3  # exit code of the child for a SynthesisError (its message is on stderr)


def _write_corpus_in_child(folder: Path, params: dict) -> None:
    """Run :func:`_write_corpus` in a fresh interpreter.

    A subprocess rather than multiprocessing: "spawn" re-imports the caller's main script, which
    recurses when a user script calls this at top level without an ``if __name__`` guard.
    """
    code = "import sys; from voxrelay.data.demo_corpus import _child_main; sys.exit(_child_main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(folder), json.dumps(params)], capture_output=True, text=True, env=env
    )
    if proc.returncode == _SYNTHESIS_FAILED:
        raise SynthesisError(proc.stderr.strip().splitlines()[-1])
    if proc.returncode != 0:
        raise RuntimeError(f"demo corpus generation failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def _child_main(argv: list[str]) -> int:
    folder, params = Path(argv[0]), json.loads(argv[1])
    try:
        _write_corpus(folder, params)
    except SynthesisError as e:
        print(str(e).replace("\n", " "), file=sys.stderr)
        return _SYNTHESIS_FAILED
    return 0


def _read_done(folder: Path) -> dict | None:
    try:
        return json.loads((folder / DONE_MARKER).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _check_reusable(folder: Path, done: dict, params: dict) -> Path:
    made_with = {k: done.get(k) for k in params}
    if made_with != params:
        raise DemoCorpusError(
            f"{folder} holds a demo corpus made with {made_with}, not {params}; "
            "pass another out_dir or delete that folder"
        )
    return folder


def _remove_incomplete(folder: Path) -> None:
    """Delete a corpus folder left without its marker, but never a folder holding anything else."""
    foreign = [p.name for p in folder.iterdir() if p.name not in (METADATA, "wavs", "audio", "text", DONE_MARKER)]
    if foreign:
        raise DemoCorpusError(
            f"out_dir {str(folder)!r} exists and is not a demo corpus (it holds {sorted(foreign)[:5]}); "
            "pass a new or empty folder"
        )
    shutil.rmtree(folder)  # a stale, incomplete corpus from a killed run


def generate_demo_corpus(
    out_dir: str | Path,
    minutes: float = 20.0,
    voices: list[str] | None = None,
    seed: int = 0,
    sample_rate: int = 22050,
    layout: str = "sentences",
) -> Path:
    """Write (or reuse) a demo corpus of about ``minutes`` of speech in ``out_dir``; returns its path.

    ``voices`` defaults to :data:`DEFAULT_VOICES`; each becomes the ``speaker`` of its rows. ``layout``:
    ``sentences`` (one sentence per row) or ``dialogues`` (:mod:`voxrelay.data.demo_dialogues`).
    Idempotent: a folder with a ``DONE`` marker for the same arguments is reused as is.
    Synthesis runs in a fresh child process because libespeak-ng carries state from one sentence
    to the next (the same text comes out a few samples different on a second call, even after
    espeak_Terminate + espeak_Initialize): a fresh process makes the bytes depend on the arguments only.
    """
    if minutes <= 0:
        raise ValueError(f"minutes must be positive, got {minutes}")
    voices = list(voices or DEFAULT_VOICES)
    folder = Path(out_dir)
    params = _params(minutes, voices, seed, sample_rate, layout)
    done = _read_done(folder)
    if done is not None:
        return _check_reusable(folder, done, params)
    # Build beside the target and rename: a killed run leaves no half corpus under the final
    # name, and two ranks generating at once both end up with one complete folder.
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        _write_corpus_in_child(staging, params)
        if folder.exists() and _read_done(folder) is None:
            _remove_incomplete(folder)
        try:
            staging.rename(folder)
        except OSError:
            done = _read_done(folder)  # another process finished first: use its corpus
            if done is None:
                raise
            return _check_reusable(folder, done, params)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder
