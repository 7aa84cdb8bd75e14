"""The model families by name (``model.family``): one :class:`~voxrelay.models.seam.FamilySpec` each, the only
place a family is named outside its folder. Importing this module imports no torch (``--help`` and ``config show``
read it): a spec names its build and load functions, imported when first used.

A family outside this package registers itself through ``VOXRELAY_FAMILIES``: comma-separated ``module:ATTRIBUTE``
references to :class:`~voxrelay.models.seam.FamilySpec` objects, read when this module is first imported (a
plugin, or a test's family), so every voxrelay command and child process knows it. One that cannot be imported is
left out and named where its ``model.family`` is asked for.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxrelay.errors import ConfigError
from voxrelay.models import causal_lm, codec_lm, csm, f5, orpheus, parler, vibevoice
from voxrelay.models.seam import FamilySpec
from voxrelay.paths import EXPORT_META

if TYPE_CHECKING:
    from voxrelay.models.base import DataSpec, FamilyModel

PLUGINS_ENV = "VOXRELAY_FAMILIES"
DEFAULT_FAMILY = "codec_lm"  # a `model:` section without `family` (configs older than families)


PLUGIN_ERRORS: list[str] = []  # why a VOXRELAY_FAMILIES entry was not registered (named where its family is asked for)


def _plugins() -> list[FamilySpec]:
    specs = []
    for ref in filter(None, (r.strip() for r in os.environ.get(PLUGINS_ENV, "").split(","))):
        module, _, attr = ref.partition(":")
        try:
            spec = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as err:
            PLUGIN_ERRORS.append(f"{PLUGINS_ENV}={ref!r} could not be imported ({err}); give module:ATTRIBUTE of a "
                                 "voxrelay.models.seam.FamilySpec importable here")
            continue
        if not isinstance(spec, FamilySpec):
            PLUGIN_ERRORS.append(f"{PLUGINS_ENV}={ref!r} is a {type(spec).__name__}, not a FamilySpec")
            continue
        specs.append(spec)
    return specs


def unknown_family(name: str) -> str:
    """The message for a ``model.family`` no spec is registered as: the known ones, and any plugin that failed."""
    return (f"model.family={name!r} is not a model family; set model.family to one of: {', '.join(sorted(FAMILIES))}"
            + ("".join(f" ({why})" for why in PLUGIN_ERRORS) if PLUGIN_ERRORS else
               f" (a family of your own: name its spec in {PLUGINS_ENV}=module:ATTRIBUTE)"))


FAMILIES: dict[str, FamilySpec] = {spec.name: spec for spec in
                                   (codec_lm.SPEC, orpheus.SPEC, parler.SPEC, vibevoice.SPEC,
                                                    causal_lm.SPEC, csm.SPEC, f5.SPEC, *_plugins())}

# `voxrelay import KIND FILE`: KIND -> "module:function" turning an upstream file into (YAML text, notes)
IMPORTERS: dict[str, str] = {kind: ref for spec in FAMILIES.values() for kind, ref in spec.importers.items()}


def get_importer(kind: str):
    """The importer of ``kind`` (see :data:`IMPORTERS`), or a ConfigError naming the known kinds."""
    if kind not in IMPORTERS:
        raise ConfigError(f"cannot import {kind!r}; known: {', '.join(sorted(IMPORTERS))}")
    module, attr = IMPORTERS[kind].split(":")
    return getattr(importlib.import_module(module), attr)


class ModelFolderError(ConfigError):
    """A saved model folder whose ``voxrelay.json`` does not say which family wrote it."""


def get_family(name: str) -> FamilySpec:
    """The family registered as ``name``, or a ConfigError naming ``model.family`` and the known ones."""
    if name not in FAMILIES:
        raise ConfigError(unknown_family(name))
    return FAMILIES[name]


def as_trained(cfg: Any, train: Any) -> Any:
    """The ``model:`` section ``cfg`` with ``weights_dtype: auto`` resolved for the ``train:`` section ``train``
    (:func:`~voxrelay.models.lora_config.resolve_weights_dtype`): what training, planning and loading a run build."""
    from voxrelay.models.lora_config import resolve_weights_dtype

    value = getattr(cfg, "weights_dtype", None)  # a family without the key: its own dtypes
    if value != "auto":
        return cfg
    dtype = resolve_weights_dtype(value, train.precision, train.lora is not None)
    return cfg.model_copy(update={"weights_dtype": dtype})


def build_model(cfg: Any, data: DataSpec, seed: int, meta: bool = False) -> FamilyModel:
    """Build the model of ``cfg`` (a ``model:`` section) for ``data``; see :attr:`FamilySpec.build`."""
    return get_family(cfg.family).builder()(cfg, data, seed, meta=meta)


def codec_for_run(cfg: Any, index: dict) -> Any:
    """The codec of a run's prepared data (``index``: its index.json), refused with the fix when the run's family
    cannot learn from such data: the first half of rebuilding a run's model, shared by training and inference (the
    global RNG is seeded between the two halves in training, after the codec has loaded)."""
    from voxrelay.data.prepare import load_prepared_codec
    from voxrelay.data.shards import PrepareError

    codec = load_prepared_codec(cfg.prepared_uri, index)
    refusal = cfg.model.data_needs().refusal(cfg.model.family, index["codec"], where=f"data at {cfg.prepared_uri}")
    if refusal:
        raise PrepareError(refusal)
    return codec


def model_for_run(cfg: Any, index: dict, codec: Any) -> tuple[FamilyModel, list | None]:
    """The model a run (``cfg``, a RunConfig) trains or trained, built as it was: its dtypes (:func:`as_trained`),
    its data's codec and speakers, seeded by ``train.seed``; for a family whose examples draw on other rows
    (``uses_corpus``) the training rows too, given to it and returned (else None). Training and inference both
    rebuild a run's model here."""
    from voxrelay.data.loader import PreparedDataset
    from voxrelay.models.base import DataSpec

    model = build_model(as_trained(cfg.model, cfg.train), DataSpec.from_prepared(index, codec), cfg.train.seed)
    rows = None
    if model.uses_corpus:  # e.g. voice prompts from other clips of a voice
        rows = PreparedDataset.open(cfg.prepared_uri, "train", index, max_bytes=int(cfg.cache.max_gb * 2**30)).rows
        model.use_corpus(rows)
    return model, rows


def load_model(folder: str | os.PathLike[str]) -> FamilyModel:
    """Load a folder written by ``save_pretrained``/``export``, by the family its voxrelay.json names."""
    meta = Path(folder) / EXPORT_META
    family = DEFAULT_FAMILY  # the only family before voxrelay.json named one
    if meta.is_file():
        try:
            family = json.loads(meta.read_text()).get("family", family)
        except (json.JSONDecodeError, AttributeError):
            pass  # the family's own loader reports the broken file with its fix
    if family not in FAMILIES:
        raise ModelFolderError(f"{meta} names model family {family!r}, which this voxrelay does not know "
                               f"(known: {', '.join(sorted(FAMILIES))}); load it with the voxrelay that wrote it")
    return get_family(family).loader()(folder)
