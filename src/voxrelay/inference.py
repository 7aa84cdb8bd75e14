"""Synthesis from a run folder (latest checkpoint or a given step) or an exported folder, and export.

An export folder holds what the model's family writes (``save_pretrained``; for a Llama-based family
``model.safetensors`` + transformers ``config.json``, loadable by ``LlamaForCausalLM.from_pretrained``),
``voxrelay.json`` (family, tokenizer, vocabulary layout, speakers) and ``codec.json``
(+ ``codec.safetensors`` for the built-in codec). Models are reached only through the family seam
(:mod:`voxrelay.models.base`).

A run trained with ``train.lora`` is exported merged (the adapters folded into the base: a plain model of
its family) unless ``adapter_only``: then the folder holds peft's ``adapter_config.json`` +
``adapter_model.safetensors`` with the family's other files, and ``voxrelay.json`` gains a ``lora`` note
saying how to rebuild the base (the run's ``model`` section, data spec and seed, so ``init_from`` or the
seeded random init) and its hash; synthesis rebuilds that base, checks the hash and adds the adapters.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import yaml

from voxrelay import storage
from voxrelay.checkpoint.format import BASE_HASH
from voxrelay.checkpoint.frozen import base_hash, check_base, describe_base, has_frozen, load_trainable
from voxrelay.checkpoint.manager import CheckpointManager
from voxrelay.codecs.base import AudioCodec, FittableCodec
from voxrelay.codecs.registry import codec_from_description
from voxrelay.config import ConfigError, RunConfig, build_config, with_added_defaults
from voxrelay.data.audio import load_audio, resample
from voxrelay.data.prepare import load_index
from voxrelay.errors import UserError, one_line
from voxrelay.models import hub_cache
from voxrelay.models.base import DataSpec, FamilyModel, Request, check_request, sampling_options
from voxrelay.models.linear_ce import choose_loss
from voxrelay.models.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    adapter_key_mapping,
    apply_lora,
    module_keys,
    quiet_peft,
)
from voxrelay.models.qlora import dequantise_base, quantise_base
from voxrelay.models.registry import as_trained, build_model, codec_for_run, get_family, load_model, model_for_run
from voxrelay.paths import CONFIG_SNAPSHOT, EXPORT_META, located, output_problem, write_file, writing
from voxrelay.precision import compute_as_trained

CODEC_JSON = "codec.json"
CODEC_STATE = "codec.safetensors"
VOXRELAY_FORMAT = "voxrelay"  # export's default: what synthesize/eval load back (upstream-loadable where it can be)
LORA_NOTE = "lora"  # key of voxrelay.json in an adapter-only export: how to rebuild the base
BASE_BITS = "base_bits"  # key of that note: the base was quantised to these bits (QLoRA), absent otherwise
log = logging.getLogger(__name__)


class InferenceError(UserError, RuntimeError):
    """What to synthesise from cannot be loaded; the message says why and what to pass instead."""


def load_from_run(run_uri: str, step: int | None = None) -> tuple[FamilyModel, AudioCodec, int]:
    """Model (weights of the latest valid checkpoint, or ``step``) + codec of a run folder, computing in the
    precision the run trained in (its evals and samples: `voxrelay eval` gives training's numbers)."""
    model, codec, at, _ = _load_run(run_uri, step)
    compute_as_trained(model.module, run_config(run_uri).train.precision)
    return model, codec, at


def _load_run(run_uri: str, step: int | None) -> tuple[FamilyModel, AudioCodec, int, dict[str, Any] | None]:
    """:func:`load_from_run`, plus for a LoRA run the note an adapter-only export keeps (else None)."""
    cfg = run_config(run_uri)
    index = load_index(cfg.prepared_uri)
    hub_cache.from_bucket(cfg)  # the run's hub models, from cache.models_uri when a session put them there
    codec = codec_for_run(cfg, index)
    model, _ = model_for_run(cfg, index, codec)  # as training built it: its dtypes, its voices' prompts
    # the head loss the run trained with (train.chunked_loss): `voxrelay eval` then gives training's numbers
    choose_loss(model, cfg.train, "cuda" if _cuda() else "cpu", say=False)
    ckpt, weights, family = CheckpointManager(run_uri, reader=True).load_model(step)
    model.load_extra_state(family)  # e.g. an EMA that synthesis and export use
    if cfg.train.lora is None and not has_frozen(model.module):
        model.module.load_state_dict(weights)
        return model, codec, ckpt.step, None
    base = base_hash(model.module)  # frozen parts are rebuilt from their source, as the run built them
    check_base(ckpt.manifest.get(BASE_HASH), base, describe_base(cfg.model, cfg.train.seed),
               f"cannot load {run_uri} at step {ckpt.step}", "make the run's base reachable as it was (the same "
               "model.init_from weights; for a random init the same torch version)")
    apply_lora(model, cfg.train.lora)
    load_trainable(model.module, weights, f"checkpoint {ckpt.uri}")
    if cfg.train.lora is None:
        return model, codec, ckpt.step, None
    note = {"base": describe_base(cfg.model, cfg.train.seed), "base_hash": base, "seed": cfg.train.seed,
            "model": as_trained(cfg.model, cfg.train).model_dump(mode="json"),  # the dtypes the run trained in
            "data": DataSpec.from_prepared(index, codec).to_note()}
    if cfg.train.lora.base_bits:  # QLoRA: trained on the quantised base, which loading the export rebuilds
        note[BASE_BITS] = cfg.train.lora.base_bits
    return model, codec, ckpt.step, note


def run_config(run_uri: str) -> RunConfig:
    snapshot = storage.join(run_uri, CONFIG_SNAPSHOT)
    if not storage.exists(snapshot):
        raise InferenceError(f"{run_uri} is not a run folder (no {CONFIG_SNAPSHOT}); pass <root>/runs/<name>")
    try:
        # keys added since the run was saved stand for what it did then (train.lora.embeddings: full)
        saved = with_added_defaults(located(yaml.safe_load(storage.read_text(snapshot)) or {}, run_uri))
        return build_config(saved, snapshot)
    except ConfigError as err:
        raise InferenceError(str(err)) from None


def _read_meta(folder: Path) -> dict[str, Any]:
    """voxrelay.json of an export folder; {} when unreadable (the family's loader reports it with its fix)."""
    try:
        meta = json.loads((folder / EXPORT_META).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _load_adapter_export(path: Path) -> FamilyModel:
    """An adapter-only export: its base rebuilt as the run built it (``lora`` note of voxrelay.json), the
    base's hash checked, then peft's adapter files loaded onto it."""
    import peft
    from safetensors import safe_open

    note = _read_meta(path)[LORA_NOTE]
    fix = "run synthesize where that base is reachable as it was, or export the run merged (without --adapter-only)"
    try:
        model_cfg = build_config({"model": note["model"]}).model
        data, seed = DataSpec(**note["data"]), int(note["seed"])
    except (ConfigError, KeyError, TypeError, ValueError) as e:
        raise InferenceError(f"{path / EXPORT_META}: its {LORA_NOTE!r} note is damaged ({one_line(e)[:200]}); "
                             "export the run again") from None
    missing = [name for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if not (path / name).is_file()]
    if missing:
        raise InferenceError(f"{path} is an adapter-only export without {' or '.join(missing)}; export the run again")
    try:
        model = build_model(model_cfg, data, seed)
    except UserError as e:
        raise InferenceError(f"{path} is an adapter-only export whose base ({note.get('base')}) cannot be built "
                             f"here: {e}; {fix}") from None
    check_base(note.get("base_hash"), base_hash(model.module), str(note.get("base")),
               f"cannot load the adapter-only export {path}", fix)
    prefix = model.upstream_prefix  # the transformers model's place in module (the adapter's root)
    with quiet_peft():
        model.module = peft.PeftModel.from_pretrained(model.module, str(path), key_mapping=adapter_key_mapping(prefix))
    if note.get(BASE_BITS):  # trained on a quantised base (QLoRA): synthesis computes on the same one
        quantise_base(model, int(note[BASE_BITS]), None)
    with safe_open(str(path / ADAPTER_WEIGHTS), "pt") as f:
        saved = module_keys(set(f.keys()), prefix)
    expected = set(peft.get_peft_model_state_dict(model.module))
    if saved != expected:  # peft only warns about missing adapter tensors (they would stay at their init)
        raise InferenceError(f"{path / ADAPTER_WEIGHTS} does not fit {ADAPTER_CONFIG}: missing "
                             f"{sorted(expected - saved)[:2]}, unexpected {sorted(saved - expected)[:2]}; "
                             "export the run again")
    return model


def load_from_export(folder: str) -> tuple[FamilyModel, AudioCodec]:
    path = Path(folder)
    missing = [name for name in (EXPORT_META, CODEC_JSON) if not (path / name).is_file()]
    if missing:
        raise InferenceError(
            f"{folder} is not a complete export folder (no {' or '.join(missing)}); pass a folder written by "
            "`voxrelay export`, or a run folder <root>/runs/<name>"
        )
    model = _load_adapter_export(path) if LORA_NOTE in _read_meta(path) else load_model(path)
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


def check_export_output(out_dir: str | Path, adapter_only: bool | None = None) -> Path:
    """``out_dir`` as a Path, or an error when exporting there would overwrite something else (or, with
    ``adapter_only`` given, leave an export of the other kind's weights beside the new files)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InferenceError(f"export output {str(out)!r} is a file; pass a new or empty folder with -o")
    if (problem := output_problem(out / "x")) is not None:
        raise InferenceError(f"export output {str(out)!r} cannot be written: {problem}; pass another -o")
    if out.is_dir() and any(out.iterdir()) and not (out / EXPORT_META).is_file():
        # never mix model files into a folder of the user's that is not a previous export
        raise InferenceError(
            f"export output {str(out)!r} is a folder that holds other files and no previous export; "
            "pass a new or empty folder with -o"
        )
    if adapter_only is not None and (out / EXPORT_META).is_file():
        previous = LORA_NOTE in _read_meta(out)
        if previous != adapter_only:
            kinds = ("an adapter-only export", "a merged model") if previous else ("a full export", "an adapter")
            raise InferenceError(f"export output {str(out)!r} holds {kinds[0]}; writing {kinds[1]} there would leave "
                                 "the old weights beside the new ones: pass a new or empty folder with -o")
    return out


def export_run(run_uri: str, out_dir: str | Path, step: int | None = None, adapter_only: bool = False,
               fmt: str = VOXRELAY_FORMAT) -> int:
    """Export a run's checkpoint (latest valid, or ``step``); returns its step. See :func:`export`."""
    check_export_output(out_dir, adapter_only)
    if adapter_only and run_config(run_uri).train.lora is None:  # before loading a model for nothing
        raise InferenceError(f"--adapter-only applies to runs trained with train.lora; {run_uri} trained every "
                             "weight: export it without --adapter-only")
    if adapter_only and fmt != VOXRELAY_FORMAT:
        raise InferenceError(f"--adapter-only writes peft's files; --format {fmt} writes a whole model: pick one")
    model, codec, at, note = _load_run(run_uri, step)
    with writing(out_dir):  # a full disk at safetensors' write names the folder
        export(model, codec, out_dir, note, adapter_only, fmt)
    return at


def export(model: FamilyModel, codec: AudioCodec, out_dir: str | Path, lora_note: dict[str, Any] | None = None,
           adapter_only: bool = False, fmt: str = VOXRELAY_FORMAT) -> Path:
    """Write ``model`` (and the codec) into ``out_dir``. A LoRA model (``lora_note`` from the run) is merged
    first unless ``adapter_only``: then the folder holds peft's adapter files and the note. ``fmt`` other than
    ``voxrelay``: a format of the family's upstream (its spec's ``export_formats``), which voxrelay does not read."""
    formats = get_family(model.family).export_formats
    if fmt != VOXRELAY_FORMAT and fmt not in formats:
        raise InferenceError(f"--format {fmt}: model.family={model.family} exports as "
                             f"{', '.join((VOXRELAY_FORMAT, *formats))}")
    out = check_export_output(out_dir, adapter_only)
    if adapter_only and lora_note is None:
        raise InferenceError("--adapter-only applies to runs trained with train.lora; export without it")
    out.mkdir(parents=True, exist_ok=True)
    if lora_note is not None and not adapter_only:
        dequantise_base(model.module)  # QLoRA: the base the adapters were trained on, in its dtype, to merge into
        model.module = model.module.merge_and_unload()  # W + scale * B @ A: a plain model of the family
    if fmt != VOXRELAY_FORMAT:
        model.save_as(fmt, out, codec)
        storage.match_umask(out)  # safetensors writes 0600: readable like the user's other files
        return out
    model.save_pretrained(out)  # with a PeftModel as module, a transformers family writes peft's adapter files
    if adapter_only:
        if not (out / ADAPTER_WEIGHTS).is_file():  # a family that saves its module otherwise
            model.module.save_pretrained(str(out))
        meta = _read_meta(out) | {LORA_NOTE: lora_note}
        tmp = out / (EXPORT_META + ".tmp")  # replaced atomically: voxrelay.json marks a complete folder
        tmp.write_text(json.dumps(meta, indent=2))
        tmp.replace(out / EXPORT_META)
    (out / CODEC_JSON).write_text(json.dumps(codec.describe(), indent=2))
    if isinstance(codec, FittableCodec):
        (out / CODEC_STATE).write_bytes(codec.state_bytes())
    storage.match_umask(out)  # safetensors writes 0600: readable like the user's other files
    return out


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
