"""Synthesis from a run folder (latest checkpoint or a given step) or an exported folder, and export.

An export folder holds what the model's family writes (``save_pretrained``; for a Llama-based family
``model.safetensors`` + transformers ``config.json``, loadable by ``LlamaForCausalLM.from_pretrained``),
``voxrelay.json`` (family, tokenizer, vocabulary layout, speakers) and ``codec.json``
(+ ``codec.safetensors`` for the built-in codec). Models are reached only through the family seam
(:mod:`voxrelay.models.base`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import soundfile as sf
import yaml

from voxrelay import storage
from voxrelay.checkpoint.manager import CheckpointManager
from voxrelay.codecs.base import AudioCodec, FittableCodec
from voxrelay.codecs.registry import codec_from_description
from voxrelay.config import ConfigError, build_config
from voxrelay.data.prepare import load_index, load_prepared_codec
from voxrelay.errors import UserError
from voxrelay.models.base import DataSpec, FamilyModel
from voxrelay.models.registry import build_model, load_model
from voxrelay.paths import CONFIG_SNAPSHOT, EXPORT_META

CODEC_JSON = "codec.json"
CODEC_STATE = "codec.safetensors"


class InferenceError(UserError, RuntimeError):
    """What to synthesise from cannot be loaded; the message says why and what to pass instead."""


def load_from_run(run_uri: str, step: int | None = None) -> tuple[FamilyModel, AudioCodec, int]:
    """Model (weights of the latest valid checkpoint, or ``step``) + codec of a run folder."""
    snapshot = storage.join(run_uri, CONFIG_SNAPSHOT)
    if not storage.exists(snapshot):
        raise InferenceError(f"{run_uri} is not a run folder (no {CONFIG_SNAPSHOT}); pass <root>/runs/<name>")
    try:
        cfg = build_config(yaml.safe_load(storage.read_text(snapshot)), snapshot)
    except ConfigError as err:
        raise InferenceError(str(err)) from None
    index = load_index(cfg.prepared_uri)
    codec = load_prepared_codec(cfg.prepared_uri, index)
    model = build_model(cfg.model, DataSpec.from_prepared(index, codec), cfg.train.seed)
    ckpt, weights = CheckpointManager(run_uri, cfg.checkpoint.keep_last).load_model(step)
    model.module.load_state_dict(weights)
    return model, codec, ckpt.step


def load_from_export(folder: str) -> tuple[FamilyModel, AudioCodec]:
    path = Path(folder)
    missing = [name for name in (EXPORT_META, CODEC_JSON) if not (path / name).is_file()]
    if missing:
        raise InferenceError(
            f"{folder} is not a complete export folder (no {' or '.join(missing)}); pass a folder written by "
            "`voxrelay export`, or a run folder <root>/runs/<name>"
        )
    model = load_model(path)
    try:
        desc = json.loads((path / CODEC_JSON).read_text())
    except json.JSONDecodeError as e:
        raise InferenceError(f"{path / CODEC_JSON} is not valid JSON ({e}); export the run again") from e
    state = (path / CODEC_STATE).read_bytes() if (path / CODEC_STATE).exists() else None
    return model, codec_from_description(desc, state)


def load_any(source: str, step: int | None = None) -> tuple[FamilyModel, AudioCodec, str]:
    """A run folder (local or remote) or an export folder -> (model, codec, description)."""
    if storage.is_local(source) and (Path(storage.local_path(source)) / CODEC_JSON).exists():
        if step is not None:
            raise InferenceError("--step applies to run folders; an export folder holds one model")
        model, codec = load_from_export(storage.local_path(source))
        return model, codec, f"export {source}"
    model, codec, at = load_from_run(source, step)
    return model, codec, f"{source} step {at}"


def synthesize(
    model: FamilyModel, codec: AudioCodec, text: str, out: str | Path, speaker: str | None = None,
    temperature: float = 0.8, top_k: int = 50, seed: int = 0, max_seconds: float = 20.0,
) -> float:
    """Text -> wav file at the codec's rate; returns the duration in seconds."""
    check_synthesis_args(out, temperature, top_k, max_seconds)
    if speaker is not None and model.speakers and speaker not in model.speakers:
        raise InferenceError(f"unknown voice {speaker!r}; this model knows: {', '.join(model.speakers)}")
    if speaker is None and model.speakers:
        speaker = model.speakers[0]
    max_frames = int(max_seconds * codec.frame_rate)
    codes = model.generate(text, speaker=speaker, max_frames=max_frames, temperature=temperature, top_k=top_k,
                           seed=seed)
    wav = codec.decode(codes) if codes.shape[1] else np.zeros(0, dtype=np.float32)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(out), wav, codec.sample_rate, subtype="PCM_16")
    return len(wav) / codec.sample_rate


def check_synthesis_args(out: str | Path, temperature: float, top_k: int = 50, max_seconds: float = 20.0) -> None:
    """Refuse, before any work, arguments that would fail late or write garbage (-o, --temperature)."""
    out = Path(out)
    if out.suffix.lower() != ".wav" or out.is_dir():
        raise InferenceError(f"output {str(out)!r} is not a .wav file path; pass e.g. -o speech.wav")
    if not math.isfinite(temperature):
        raise InferenceError(f"--temperature must be a finite number (0 = greedy), got {temperature}")
    if top_k < 0 or not max_seconds > 0:
        raise InferenceError(f"top_k must be >= 0 and max_seconds > 0, got top_k={top_k}, max_seconds={max_seconds}")


def check_export_output(out_dir: str | Path) -> Path:
    """``out_dir`` as a Path, or an error when exporting there would overwrite something else."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InferenceError(f"export output {str(out)!r} is a file; pass a new or empty folder with -o")
    if out.is_dir() and any(out.iterdir()) and not (out / EXPORT_META).is_file():
        # never mix model files into a folder of the user's that is not a previous export
        raise InferenceError(
            f"export output {str(out)!r} is a folder that holds other files and no previous export; "
            "pass a new or empty folder with -o"
        )
    return out


def export(model: FamilyModel, codec: AudioCodec, out_dir: str | Path) -> Path:
    out = check_export_output(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    (out / CODEC_JSON).write_text(json.dumps(codec.describe(), indent=2))
    if isinstance(codec, FittableCodec):
        (out / CODEC_STATE).write_bytes(codec.state_bytes())
    return out
