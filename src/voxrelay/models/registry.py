"""Model families by name (``model.family``): a dict of implementations, each imported only when
used, so that ``--help`` and ``config show`` import no torch.

The names are the tags of the ``model:`` union (:data:`voxrelay.models.configs.FAMILY_CONFIGS`);
a test keeps the two in step.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxrelay.config import ConfigError
from voxrelay.paths import EXPORT_META

if TYPE_CHECKING:
    from voxrelay.models.base import DataSpec, Family, FamilyModel

# name -> "module:attribute" of a class implementing voxrelay.models.base.Family
FAMILIES: dict[str, str] = {
    "codec_lm": "voxrelay.models.codec_lm.family:CodecLMFamily",
    "orpheus": "voxrelay.models.orpheus.family:OrpheusFamily",
    "parler": "voxrelay.models.parler.family:ParlerFamily",
    "vibevoice": "voxrelay.models.vibevoice.family:VibeVoiceFamily",
}


# `voxrelay import KIND FILE`: KIND -> "module:function" turning an upstream file into (YAML text, notes)
IMPORTERS: dict[str, str] = {
    "parler-config": "voxrelay.models.parler.importer:import_config",
}


def get_importer(kind: str):
    """The importer of ``kind`` (see :data:`IMPORTERS`), or a ConfigError naming the known kinds."""
    if kind not in IMPORTERS:
        raise ConfigError(f"cannot import {kind!r}; known: {', '.join(sorted(IMPORTERS))}")
    module, attr = IMPORTERS[kind].split(":")
    return getattr(importlib.import_module(module), attr)


class ModelFolderError(ConfigError):
    """A saved model folder whose ``voxrelay.json`` does not say which family wrote it."""


def get_family(name: str) -> Family:
    """The family registered as ``name``, or a ConfigError naming ``model.family`` and the known ones."""
    if name not in FAMILIES:
        raise ConfigError(f"model.family={name!r} is not a model family; set model.family to one of: "
                          f"{', '.join(sorted(FAMILIES))}")
    module, attr = FAMILIES[name].split(":")
    return getattr(importlib.import_module(module), attr)()


def as_trained(cfg: Any, train: Any) -> Any:
    """The ``model:`` section ``cfg`` with ``weights_dtype: auto`` resolved for the ``train:`` section ``train``
    (:func:`~voxrelay.models.lora_config.resolve_weights_dtype`): what training, planning and loading a run build."""
    from voxrelay.models.lora_config import resolve_weights_dtype

    value = getattr(cfg, "weights_dtype", None)
    if value != "auto":
        return cfg
    dtype = resolve_weights_dtype(value, train.precision, train.lora is not None)
    return cfg.model_copy(update={"weights_dtype": dtype})


def build_model(cfg: Any, data: DataSpec, seed: int, meta: bool = False) -> FamilyModel:
    """Build the model of ``cfg`` (a ``model:`` section) for ``data``; see :meth:`Family.build`."""
    return get_family(cfg.family).build(cfg, data, seed, meta=meta)


def load_model(folder: str | os.PathLike[str]) -> FamilyModel:
    """Load a folder written by ``save_pretrained``/``export``, by the family its voxrelay.json names."""
    meta = Path(folder) / EXPORT_META
    family = "codec_lm"  # the only family before voxrelay.json named one
    if meta.is_file():
        try:
            family = json.loads(meta.read_text()).get("family", family)
        except (json.JSONDecodeError, AttributeError):
            pass  # the family's own loader reports the broken file with its fix
    if family not in FAMILIES:
        raise ModelFolderError(f"{meta} names model family {family!r}, which this voxrelay does not know "
                               f"(known: {', '.join(sorted(FAMILIES))}); load it with the voxrelay that wrote it")
    return get_family(family).load(folder)
