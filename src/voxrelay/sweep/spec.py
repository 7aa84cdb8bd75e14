"""A sweep file (``voxrelay sweep SWEEP.yaml``): a base config and the experiments, each a set of overrides.

.. code-block:: yaml

    base: base.yaml            # relative to this file (or an absolute path, or gs://... / s3://...)
    name: lr-opt               # optional: the file's name without .yaml
    grid:                      # every combination
      train.lr: [1.0e-4, 5.0e-5, 1.0e-5]
      train.optimizer: [adamw, lion]
    list:                      # explicit override sets (with a grid: every grid point x every entry)
      - {train.lr: 3.0e-4, model.dropout: 0.1}

Each experiment is a run ``<root>/runs/<sweep>-<what it sets>-<hash>``: the name is derived from the
overrides (sorted) and the base config's content (its YAML as parsed, ``root`` and ``name`` left out), so every
machine and every later session computes the same one, and two sweeps of one name over different bases never
share a run folder.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from voxrelay import storage
from voxrelay.config.source import read_config_text
from voxrelay.errors import UserError

SWEEPS_DIR = "sweeps"
_SLUG_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_KEYS = ("base", "name", "grid", "list")


class SweepError(UserError):
    """A sweep file that cannot be used; the message names the file, the key and the fix."""


def format_value(value) -> str:
    """An override's value as the command line spells it (YAML flow: 0.0001, adamw, [1, 2], null)."""
    if isinstance(value, float):
        text = repr(value)  # 5e-05: YAML 1.1 (PyYAML) reads an exponent without a '.' as a string
        return text.replace("e", ".0e", 1) if "e" in text and "." not in text else text
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


@dataclass(frozen=True)
class Experiment:
    name: str  # the run's name (its folder under <root>/runs/)
    overrides: dict = field(default_factory=dict)  # dotted key -> value

    def args(self) -> list[str]:
        """``key=value`` overrides for `voxrelay train`, the run's name last."""
        return [f"{k}={format_value(v)}" for k, v in self.overrides.items()] + [f"name={self.name}"]

    def label(self) -> str:
        return " ".join(f"{k.rsplit('.', 1)[-1]}={format_value(v)}" for k, v in self.overrides.items()) or "(base)"


@dataclass(frozen=True)
class Sweep:
    source: str  # the sweep file (path or URI)
    name: str
    base: str  # the base config (path or URI)
    base_digest: str  # of the base config's content (part of every experiment's name)
    overrides: tuple[str, ...]  # from the command line: for every experiment (root=..., train.max_steps=...)
    experiments: tuple[Experiment, ...]


def base_digest(base: str) -> str:
    """The base config's identity: a hash of its YAML as parsed (comments, key order and layout do not count),
    without ``root`` and ``name`` (where runs go, not what they train). Raises ConfigError when it is missing."""
    data = yaml.safe_load(read_config_text(base)) or {}
    if not isinstance(data, dict):
        raise SweepError(f"base config {base}: the top level must be a mapping of sections (name, root, data, ...)")
    content = {k: v for k, v in data.items() if k not in ("root", "name")}
    return hashlib.sha1(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


def experiment_name(sweep: str, overrides: dict, base: str = "") -> str:
    """``<sweep>-<key>-<value>...-<6 hex>``: readable, and unique and stable through the hash of the sorted
    overrides (the order keys are written in does not matter) and of ``base`` (:func:`base_digest`)."""
    pairs = sorted((k, format_value(v)) for k, v in overrides.items())
    canonical = json.dumps([base, pairs] if base else pairs)
    digest = hashlib.sha1(canonical.encode()).hexdigest()[:6]
    slug = "-".join(f"{k.rsplit('.', 1)[-1]}-{format_value(v)}" for k, v in sorted(overrides.items()))
    slug = _SLUG_BAD.sub("_", slug).strip("._-")[:60].rstrip("._-")
    return "-".join(part for part in (sweep, slug, digest) if part)


_EXPONENT = re.compile(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+")


def _number(value):
    """1e-4 written in the sweep file: YAML 1.1 reads it as a string; it is the number."""
    if isinstance(value, str) and _EXPONENT.fullmatch(value):
        return float(value)
    return [_number(v) for v in value] if isinstance(value, list) else value


def _mapping(value, source: str, key: str) -> dict:
    if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
        raise SweepError(f"{source}: `{key}` must map dotted config keys to values, e.g. "
                         "{train.lr: 1.0e-4, train.optimizer: lion}")
    return {k: _number(v) for k, v in value.items()}


def expand(data: dict, source: str) -> list[dict]:
    """The override sets of a sweep file's ``grid`` and ``list`` (grid x list when both are given)."""
    grid = _mapping(data.get("grid") or {}, source, "grid")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"{source}: grid key {key!r} must list its values, e.g. {key}: [1.0e-4, 5.0e-5]")
    points = [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())] if grid else [{}]
    entries = data.get("list") or [{}]
    if not isinstance(entries, list):
        raise SweepError(f"{source}: `list` must be a list of override sets, e.g. - {{train.lr: 3.0e-4}}")
    sets = []
    for i, entry in enumerate(entries):
        entry = _mapping(entry, source, f"list[{i}]")
        for point in points:
            if both := sorted(set(point) & set(entry)):
                raise SweepError(f"{source}: list[{i}] sets {', '.join(both)}, which the grid varies too; "
                                 "vary a key in one of the two")
            sets.append({**point, **entry})
    if sets == [{}]:
        raise SweepError(f"{source}: no experiments: give a `grid` (key: [values]) and/or a `list` of override sets")
    return sets


def _read(source: str) -> dict:
    local = "://" not in source or source.startswith("file://")
    if local and not Path(storage.local_path(source)).is_file():
        raise SweepError(f"sweep file {source!r} does not exist; pass the path (or gs:// / s3:// URI) of a YAML file")
    if not local and not storage.exists(source):
        raise SweepError(f"sweep file {source} does not exist; upload it there, or pass its local path")
    try:
        data = yaml.safe_load(storage.read_text(source)) or {}
    except yaml.YAMLError as e:
        raise SweepError(f"{source}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(data, dict):
        raise SweepError(f"{source}: the top level must be a mapping with `base` and `grid` and/or `list`")
    if unknown := sorted(set(data) - set(_KEYS)):
        raise SweepError(f"{source}: unknown key(s) {', '.join(unknown)}; a sweep file has {', '.join(_KEYS)}")
    return data


def _base_path(source: str, base) -> str:
    if not isinstance(base, str) or not base:
        raise SweepError(f"{source}: `base` (the config every experiment starts from) is missing; add e.g. "
                         "base: base.yaml (a path relative to the sweep file)")
    if "://" in base or base.startswith("/"):
        return base
    head = source.rsplit("/", 1)[0] if "/" in source else "."
    return storage.join(head, base) if "://" in source else str(Path(head) / base)


def load_sweep(source: str, overrides: list[str] | None = None) -> Sweep:
    data = _read(source)
    name = data.get("name") or Path(source.rstrip("/").rsplit("/", 1)[-1]).stem
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise SweepError(f"{source}: sweep name {name!r} must be letters, digits, '.', '_' or '-' (it names folders); "
                         "set `name:` in the sweep file")
    sets = expand(data, source)
    names = [experiment_name(name, s) for s in sets]  # the base's hash is the same in every name
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise SweepError(f"{source}: the same experiment is listed twice ({', '.join(dupes)}); remove the repeat")
    base = _base_path(source, data.get("base"))
    digest = base_digest(base)
    experiments = tuple(Experiment(experiment_name(name, s, digest), s) for s in sets)
    return Sweep(source, name, base, digest, tuple(overrides or ()), experiments)
