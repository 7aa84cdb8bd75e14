"""Export: a run's checkpoint written as a self-contained folder (merged, adapter-only, or an upstream format)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from voxrelay import storage
from voxrelay.codecs.base import AudioCodec, FittableCodec
from voxrelay.inference.load import (
    CODEC_JSON,
    CODEC_STATE,
    LORA_NOTE,
    VOXRELAY_FORMAT,
    InferenceError,
    _load_run,
    _read_meta,
    run_config,
)
from voxrelay.models.base import FamilyModel
from voxrelay.models.lora import (
    ADAPTER_WEIGHTS,
)
from voxrelay.models.qlora import dequantise_base
from voxrelay.models.registry import get_family
from voxrelay.paths import EXPORT_META, output_problem, writing


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
