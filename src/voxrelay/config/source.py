"""Where a config's YAML comes from: a local file, or an object in storage (gs://, s3://, file://, memory://);
and the command line's ``key.sub=value`` overrides applied to it.

A config in the bucket is what a Colab notebook or a spot job trains from: every session, on any machine, reads
the same file, and nothing has to be copied onto a machine that will be gone tomorrow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from voxrelay.errors import ConfigError

_UPLOAD = {"gs": "gcloud storage cp my.yaml {uri}", "s3": "aws s3 cp my.yaml {uri}"}


def read_config_text(source: str) -> str:
    """The text of the config at ``source``: a local path, or a storage URI (it contains ``://``).
    Raises ConfigError naming the source and the fix when there is no such file or object (a denied access is
    storage's StorageDenied, which names the bucket and the credentials to check)."""
    if "://" not in source:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist; pass the path of a YAML file")
        return path.read_text()
    from voxrelay import storage

    try:
        return storage.read_text(source)
    except FileNotFoundError:
        upload = _UPLOAD.get(source.split("://", 1)[0], "").format(uri=source)
        how = f"upload it first (`{upload}`)" if upload else "write it first"
        raise ConfigError(f"config {source!r} does not exist; {how}, or fix the URI (a gs://, s3:// or file:// "
                          "URI of a YAML object, or a local path)") from None


def _list_hint(parts: list[str], part: str) -> str:
    """How to give the list ``part`` of a dotted key: whole, in YAML."""
    return (f"; a list is given whole, in YAML: '{'.'.join(parts[:parts.index(part) + 1])}=[...]' (e.g. "
            "'data.sources=[{type: folder, path: /data/mine}]')")


def _parse_value(raw: str) -> Any:
    """Parse an override value as YAML (so 1e-4, true, null, [a, b] work), keeping strings as is."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if isinstance(value, str):  # YAML 1.1 reads "1e-4" as a string
        try:
            return float(value)
        except ValueError:
            return value
    return value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` strings to a nested dict (in place) and return it."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value; write e.g. train.max_steps=100")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        index = next((p for p in parts[1:] if p.isdigit()), None)
        if index is not None:  # data.sources.0.path: an item of a list
            raise ConfigError(f"override {key!r}: {index!r} is not a key"
                              + _list_hint(parts, parts[parts.index(index) - 1]))
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if child is None or child is True:  # absent, off (train.lora: null), or on with its defaults
                child = node[part] = {}  # (train.lora=true train.lora.r=8: the section with r set)
            elif not isinstance(child, dict):
                raise ConfigError(f"override {key!r}: {part!r} is a value, not a section"
                                  + (_list_hint(parts, part) if isinstance(child, list) else ""))
            node = child
        value = _parse_value(raw)
        if parts[-1] in ("name", "root", "path", "hub_id", "tokenizer", "init_from") and value is not None:
            value = str(raw)  # names and paths are strings even when they look like numbers
        if value is True and isinstance(node.get(parts[-1]), dict):
            continue  # a section already set (train.lora.r=8 train.lora=true): it is on, with its keys
        node[parts[-1]] = value
    return data
