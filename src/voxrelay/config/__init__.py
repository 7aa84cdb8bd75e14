"""The typed run configuration: one YAML file + ``key.sub=value`` overrides (:mod:`voxrelay.config.run`: the
sections, ``load_config``; :mod:`voxrelay.config.fields`: the base of every section; :mod:`voxrelay.config.source`:
where the YAML comes from; :mod:`voxrelay.config.reference`: the generated reference).

Every field has a description; a bad value raises :class:`ConfigError` that names the key, the value and the fix.
``voxrelay config show CONFIG [overrides]`` prints the resolved config.

The names of :mod:`voxrelay.config.run` are read from it on first use (``from voxrelay.config import RunConfig``
works as always): the section modules elsewhere (``train/config.py``, ``quality/config.py`` ...) import
:mod:`voxrelay.config.fields`, which runs this file first, so this file imports none of them itself.
"""

from __future__ import annotations

import importlib
from typing import Any

from voxrelay.errors import ConfigError  # noqa: F401 (public here)


def __getattr__(name: str) -> Any:
    if name.startswith("__") or name in ("run", "fields", "source", "reference"):  # the import system's own lookups
        raise AttributeError(f"module 'voxrelay.config' has no attribute {name!r}")
    run = importlib.import_module("voxrelay.config.run")
    try:
        return getattr(run, name)
    except AttributeError:
        raise AttributeError(f"module 'voxrelay.config' has no attribute {name!r}") from None
