"""A Whisper in transformers' layout (a local folder, or a hub id such as ``openai/whisper-large-v3``) as
faster-whisper reads it: converted once to CTranslate2 by ctranslate2's own converter (faster-whisper installs
ctranslate2) into the voxrelay cache, keyed by the folder's content, then scored exactly as a CTranslate2 Whisper is
(the same packing, beam search and word timestamps)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from voxrelay.paths import cache_dir

HUB_FILES = ["*.json", "*.txt", "model.bin", "*.safetensors"]  # CTranslate2's files or transformers' (no .bin twice)


def is_transformers_whisper(folder: Path) -> bool:
    """True for a folder holding a transformers Whisper (``config.json`` of ``model_type`` whisper, no model.bin)."""
    if (folder / "model.bin").exists() or not (folder / "config.json").is_file():
        return False
    try:
        return json.loads((folder / "config.json").read_text()).get("model_type") == "whisper"
    except (OSError, ValueError):
        return False


def fetch(hub_id: str) -> Path:
    """The hub repo ``hub_id`` in the Hugging Face cache (downloaded once): CTranslate2's files or transformers'."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(hub_id, allow_patterns=HUB_FILES))


def converted(folder: Path) -> Path:
    """The CTranslate2 conversion of the transformers Whisper in ``folder`` (made on first use, then reused)."""
    weights = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin"))
    if not weights:
        raise ValueError("no weights (model.safetensors) beside its config.json")
    key = hashlib.sha256((folder / "config.json").read_bytes())
    for p in weights:
        key.update(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}".encode())
    out = cache_dir("asr", f"ct2-{key.hexdigest()[:16]}")
    if (out / "model.bin").exists():
        return out
    from ctranslate2.converters import TransformersConverter

    tmp = out.parent / f".{out.name}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    copy = [f for f in ("tokenizer.json", "preprocessor_config.json") if (folder / f).is_file()]
    TransformersConverter(str(folder), copy_files=copy).convert(str(tmp), quantization="float16")
    processor = folder / "processor_config.json"  # transformers 5 keeps the feature extractor's settings here
    if "preprocessor_config.json" not in copy and processor.is_file():
        extractor = json.loads(processor.read_text()).get("feature_extractor")
        if extractor:  # faster-whisper reads the mel bins (128 for large-v3) from preprocessor_config.json
            (tmp / "preprocessor_config.json").write_text(json.dumps(extractor))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
