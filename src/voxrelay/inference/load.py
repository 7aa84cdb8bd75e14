"""Loading a trained model: from a run folder (its config, prepared data and a checkpoint, the model rebuilt as
training built it) or from an export folder (merged, or an adapter over a rebuilt base)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import yaml

from voxrelay import storage
from voxrelay.checkpoint.format import BASE_HASH
from voxrelay.checkpoint.frozen import base_hash, check_base, describe_base, has_frozen, load_trainable
from voxrelay.checkpoint.manager import CheckpointManager
from voxrelay.codecs.base import AudioCodec
from voxrelay.codecs.registry import codec_from_description
from voxrelay.config import ConfigError, RunConfig, build_config, with_added_defaults
from voxrelay.data.prepare import load_index
from voxrelay.errors import UserError, one_line
from voxrelay.models import hub_cache
from voxrelay.models.base import DataSpec, FamilyModel
from voxrelay.models.linear_ce import choose_loss
from voxrelay.models.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    adapter_key_mapping,
    apply_lora,
    module_keys,
    quiet_peft,
)
from voxrelay.models.qlora import quantise_base
from voxrelay.models.registry import as_trained, build_model, codec_for_run, load_model, model_for_run
from voxrelay.paths import CONFIG_SNAPSHOT, EXPORT_META, located, not_a_run
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
    apply_lora(model, cfg.train.lora, training=False)
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
        raise InferenceError(f"{not_a_run(run_uri)}; pass <root>/runs/<name>")
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


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
