"""Synthesis: a request (text or a dialogue script, a voice, voice prompts) spoken into a wav file, and the checks
of its arguments that run before any model loads."""

from __future__ import annotations

import dataclasses
import io
import logging
import math
from pathlib import Path

import numpy as np
import soundfile as sf
import yaml

from voxrelay.codecs.base import AudioCodec
from voxrelay.data.audio import load_audio, resample
from voxrelay.errors import one_line
from voxrelay.inference.load import InferenceError
from voxrelay.models.base import FamilyModel, Request, check_request, sampling_options
from voxrelay.paths import output_problem, write_file

log = logging.getLogger(__name__)


def synthesize(
    model: FamilyModel, codec: AudioCodec, request: Request | str, out: str | Path, temperature: float = 0.8,
    top_k: int = 50, seed: int = 0, max_seconds: float = 20.0, top_p: float | None = None,
    repetition_penalty: float | None = None,
) -> float:
    """A request (or a bare text) -> wav file; returns the duration in seconds. A speaker the model does not
    know, or a field its family does not take (a description), is refused naming the fix. ``top_p``,
    ``repetition_penalty``: None is the family's default (upstream's), for a family that samples with them."""
    request = Request(request) if isinstance(request, str) else request
    check_synthesis_args(out, temperature, top_k, max_seconds)
    check_sampling_args(top_p, repetition_penalty)
    options = sampling_options(model, top_p=top_p, repetition_penalty=repetition_penalty)
    check_request(model, request)
    speaker = request.speaker
    if speaker is not None and model.speakers and speaker not in model.speakers:
        raise InferenceError(f"unknown voice {speaker!r}; this model knows: {', '.join(model.speakers)}")
    if speaker is None and model.speakers:
        request = dataclasses.replace(request, speaker=model.speakers[0])
    max_frames = int(max_seconds * (model.frame_rate or codec.frame_rate))
    speech = model.speak(request, codec, max_frames=max_frames, temperature=temperature, top_k=top_k, seed=seed,
                         **options)
    wav = io.BytesIO()  # written whole, then put in place: libsndfile's errors on a file lose the errno
    sf.write(wav, speech.wav, speech.sample_rate, format="WAV", subtype="PCM_16")
    write_file(out, wav.getvalue())
    return len(speech.wav) / speech.sample_rate


def read_text_or_script(text: str | None, script: str | Path | None) -> str:
    """``text``, or the text of the ``script`` file (one of them); refused when empty."""
    if (text is None) == (script is None):
        raise InferenceError("give the text to speak or --script FILE (one of them)")
    if script is not None:
        try:
            text = Path(script).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InferenceError(f"--script {str(script)!r} cannot be read ({e}); pass a UTF-8 text file") from None
    if not text.strip():
        raise InferenceError(f"--script {str(script)!r} is empty; write the text to speak in it" if script is not None
                             else "the text to speak is empty; pass some words (or --script FILE)")
    return text


def build_request(model: FamilyModel, codec: AudioCodec, text: str | None, script: str | Path | None,
                  voices: list[str] | None, description: str | None = None) -> Request:
    """The request of ``synthesize``: ``text`` or the text of the ``script`` file (one of them); ``voices``: for
    a family that clones voices from prompts, ``N=clip.wav`` per speaker (or one ``clip.wav`` for speaker 0),
    each clip read and resampled to the codec's rate; otherwise at most one speaker name."""
    text = read_text_or_script(text, script)
    voices = list(voices or [])
    if "voice_prompts" not in model.request_fields:
        if len(voices) > 1:
            raise InferenceError(f"model.family={model.family} speaks one voice at a time: give one --voice NAME")
        return Request(text, voices[0] if voices else None, description)
    clips = read_voice_prompts(voices, int(codec.sample_rate))
    return Request(text, None, description, tuple(clips[i] for i in sorted(clips)))


def read_voice_prompts(voices: list[str], rate: int | None = None) -> dict[int, np.ndarray]:
    """Speaker -> its clip (mono float32, resampled to ``rate`` when given) of ``--voice`` options in the
    clone-from-prompt form; malformed options, gaps, missing or unreadable files are refused naming them."""
    clips: dict[int, np.ndarray] = {}
    for spec in voices:
        index, _, path = spec.rpartition("=") if "=" in spec else ("0", "", spec)
        if not index.isdigit() or int(index) in clips:
            raise InferenceError(f"--voice {spec!r}: write SPEAKER=FILE with each speaker once, e.g. --voice 0=a.wav")
        clips[int(index)] = _voice_clip(path, rate, spec)
    if clips and sorted(clips) != list(range(len(clips))):
        raise InferenceError(f"--voice gives speakers {sorted(clips)}: give speakers 0, 1, ... without gaps")
    return clips


def check_voice_prompts(source: str, voices: list[str] | None) -> None:
    """Before a model is loaded: read every ``--voice`` clip when ``source`` (a run or export folder) takes voice
    prompts (its family, from its JSON/YAML), else check the voice is one it knows; a source that cannot be read
    is left to the load to report."""
    from voxrelay.monitor.status import StatusError, voice_input

    if not voices:
        return
    try:
        takes = voice_input(source)
    except (StatusError, OSError, ValueError, yaml.YAMLError):
        return
    if takes.prompts:
        read_voice_prompts(list(voices))
    elif len(voices) > 1:
        raise InferenceError(f"model.family={takes.family} speaks one voice at a time: give one --voice NAME")
    elif takes.names and voices[0] not in takes.names:
        raise InferenceError(f"unknown voice {voices[0]!r}; this model knows: {', '.join(takes.names)} "
                             "(`voxrelay voices` lists them)")


def _voice_clip(path: str, rate: int | None, spec: str) -> np.ndarray:
    try:
        wav, sr = load_audio(path)
    except (OSError, RuntimeError) as e:
        raise InferenceError(f"--voice {spec!r}: {path!r} cannot be read as audio ({one_line(e)}); pass a wav/flac "
                             "file") from None
    wav = wav.mean(axis=1) if wav.ndim == 2 else wav
    if wav.size == 0:
        raise InferenceError(f"--voice {spec!r}: {path!r} holds no audio")
    if rate is None or sr == rate:
        return wav
    log.info("--voice %s: resampled from %d Hz to %d Hz", spec, sr, rate)
    return resample(wav, sr, rate)


def check_synthesis_args(out: str | Path, temperature: float, top_k: int = 50, max_seconds: float = 20.0) -> None:
    """Refuse, before any work, arguments that would fail late or write garbage (-o, --temperature)."""
    out = Path(out)
    if out.suffix.lower() != ".wav" or out.is_dir():
        raise InferenceError(f"output {str(out)!r} is not a .wav file path; pass e.g. -o speech.wav")
    if (problem := output_problem(out)) is not None:
        raise InferenceError(f"output {str(out)!r} cannot be written: {problem}; pass another -o")
    if not math.isfinite(temperature):
        raise InferenceError(f"--temperature must be a finite number (0 = greedy), got {temperature}")
    if top_k < 0 or not max_seconds > 0:
        raise InferenceError(f"top_k must be >= 0 and max_seconds > 0, got top_k={top_k}, max_seconds={max_seconds}")


def check_sampling_args(top_p: float | None, repetition_penalty: float | None) -> None:
    """Refuse, before the model loads, a --top-p outside (0, 1] or a --repetition-penalty that is not > 0."""
    if top_p is not None and not 0 < top_p <= 1:
        raise InferenceError(f"--top-p must be in (0, 1] (1: off), got {top_p}")
    if repetition_penalty is not None and not (math.isfinite(repetition_penalty) and repetition_penalty > 0):
        raise InferenceError(f"--repetition-penalty must be > 0 (1: off), got {repetition_penalty}")
