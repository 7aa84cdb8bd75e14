"""The configuration reference page (docs/reference/config.md), generated from the config classes of
:mod:`voxrelay.config` (``scripts/update_reference.py`` writes it; a test keeps the page in sync), and the key
an unknown one was probably meant to be."""

from __future__ import annotations

import difflib
import functools
import json
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from voxrelay.config import RunConfig, SourceConfig
from voxrelay.models.registry import FAMILIES


def reference_markdown() -> str:
    """The configuration reference (every key, default, description) as Markdown tables."""
    lines: list[str] = []

    def section(model: type[BaseModel], prefix: str) -> None:
        rows, subs = [], []
        for name, field in model.model_fields.items():
            variants = _sections_of(field.annotation)
            if variants:
                subs.extend((sub, f"{prefix}{name}.") for sub in variants)
                if type(None) not in get_args(field.annotation):
                    continue  # an optional section (train.lora) also gets a row: what null means
            default = "required" if field.is_required() else field.get_default(call_default_factory=True)
            if isinstance(default, BaseModel):  # an optional section on by default (eval.asr)
                default = {}
            if isinstance(default, list) and default and isinstance(default[0], BaseModel):
                default = [d.model_dump(exclude_defaults=True) for d in default]
            shown = default if field.is_required() else json.dumps(default)
            rows.append(f"| `{prefix}{name}` | `{shown}` | {field.description or ''} |")
        if rows:
            title = f"**{prefix.rstrip('.') or 'top level'}**"
            if model in [spec.config for spec in FAMILIES.values()]:  # one table per family, all under `model.`
                title += f" (when `model.family: {model.model_fields['family'].default}`)"
            lines.extend([title, "", "| key | default | meaning |", "|---|---|---|", *rows, ""])
        for sub, sub_prefix in subs:
            section(sub, sub_prefix)

    section(RunConfig, "")
    lines.extend(["**data.sources[]** (each source)", "", "| key | default | meaning |", "|---|---|---|"])
    for name, field in SourceConfig.model_fields.items():
        default = "required" if field.is_required() else json.dumps(field.get_default(call_default_factory=True))
        lines.append(f"| `{name}` | `{default}` | {field.description or ''} |")
    return "\n".join(lines) + "\n"


def _sections_of(annotation: Any) -> list[type[BaseModel]]:
    """The section classes a field holds: one, or each variant of a union (``model``: one per family)."""
    candidates = list(get_args(annotation)) if get_origin(annotation) in (Union, UnionType) else [annotation]
    return [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]


def near_key(loc: list[str | int]) -> str | None:
    """The known key nearest to the unknown one at ``loc`` (its siblings only, e.g. ``train.max_stepz`` ->
    ``train.max_steps``, ``data.sources.0.pathh`` -> ``data.sources.0.path``), or None when none is close."""
    parent = tuple("[]" if isinstance(p, int) else p for p in loc[:-1])
    close = difflib.get_close_matches(str(loc[-1]), sorted(_children().get(parent, ())), n=1, cutoff=0.6)
    return ".".join(str(p) for p in [*loc[:-1], close[0]]) if close else None


@functools.cache  # one walk of the config classes, however many keys a config gets wrong
def _children() -> dict[tuple[str, ...], set[str]]:
    """Each section's path (list items as ``[]``) -> the names of its keys and subsections (every family's
    under ``model``)."""
    tree: dict[tuple[str, ...], set[str]] = {}

    def walk(model: type[BaseModel], path: tuple[str, ...]) -> None:
        for name, field in model.model_fields.items():
            tree.setdefault(path, set()).add(name)
            for sub in _sections_of(field.annotation):
                walk(sub, (*path, name))

    walk(RunConfig, ())
    walk(SourceConfig, ("data", "sources", "[]"))
    return tree
