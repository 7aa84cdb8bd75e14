"""Loading ``transformers`` causal LMs for any family (``model.init_from``, saved folders), with errors
that name the config key and the fix instead of transformers' tracebacks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from voxrelay.errors import UserError, one_line
from voxrelay.paths import EXPORT_META

FIX = "point it at a folder written by save_pretrained (config.json + model.safetensors) or at a HF hub id"


class ModelLoadError(UserError, ValueError):
    """``model.init_from`` or a saved model folder cannot be loaded; the message names it and the fix."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """A model folder that does not exist or was not written completely."""


# a hub repo id as huggingface_hub validates it: ``name`` or ``owner/name``, word characters, '-' and '.', starting
# and ending with a word character, at most 96 each, no '--' or '..'
_HUB_PART = r"\w(?:[\w.-]{0,94}\w)?"
_HUB_ID = re.compile(rf"(?:{_HUB_PART}/)?{_HUB_PART}")


def looks_local(spec: str) -> bool:
    """True when ``spec`` can only be a local path: anything that is not a hub id (``name`` or ``owner/name`` as
    huggingface_hub accepts them), e.g. ``/abs/path``, ``./x``, ``~/x``, ``a/b/c``, ``my models/x``, ``C:\\x``."""
    return spec.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(spec) or "--" in spec or ".." in spec


def missing_folder(spec: str, what: str, fix: str) -> str | None:
    """The error message when ``spec`` can only be a local folder and is not one (None when it is a folder, or
    may be a hub id); says where a relative path was looked for."""
    folder = Path(spec).expanduser()
    if folder.is_dir() or not looks_local(spec):
        return None
    where = "" if folder.is_absolute() else f" (looked for {folder.absolute()})"
    return f"{what}={spec!r}: no such folder{where}, and not a hub id (owner/name); {fix}"


def load_causal_lm(source: str, what: str, **kwargs: Any) -> Any:
    """``AutoModelForCausalLM.from_pretrained(source)`` whose failures name ``what`` (e.g. ``model.init_from``)
    and the fix; weights that leave part of the model random are refused rather than trained on."""
    from transformers import AutoModelForCausalLM

    folder = Path(source).expanduser()
    if problem := missing_folder(source, what, FIX):
        raise ModelNotFoundError(problem)
    if folder.is_dir() and not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"{what}={source!r}: the folder has no config.json; {FIX}")
    where = "local folder" if folder.is_dir() else "hub id (it is not a local folder)"
    try:
        module, info = AutoModelForCausalLM.from_pretrained(
            str(folder) if folder.is_dir() else source, output_loading_info=True, **kwargs
        )
    except OSError as e:  # no weights file, or a hub id that cannot be fetched
        raise ModelNotFoundError(f"{what}={source!r} cannot be loaded as a {where} ({one_line(e)}); {FIX}") from e
    except (ValueError, KeyError) as e:  # config.json of no known causal LM
        raise ModelLoadError(f"{what}={source!r} is not a causal LM ({one_line(e)[:300]}); {FIX}") from e
    except RuntimeError as e:  # weights whose shapes disagree with config.json
        raise ModelLoadError(
            f"{what}={source!r}: its weights do not fit its config.json ({one_line(e)[:300]}); {FIX}"
        ) from e
    missing = list(info.get("missing_keys") or [])
    if missing:
        raise ModelLoadError(
            f"{what}={source!r}: its weights lack {len(missing)} tensors of the model its config.json describes "
            f"(e.g. {sorted(missing)[:3]}), which would start random; {FIX}"
        )
    return module


def from_pretrained_whole(cls: Any, spec: str, source: str, what: str, **kwargs: Any) -> Any:
    """``cls.from_pretrained(source, **kwargs)`` (``source``: ``spec`` resolved to a folder or hub id) whose failures
    name ``what=spec`` and the fix; weights that would leave part of the model random are refused."""
    try:
        model, info = cls.from_pretrained(source, output_loading_info=True, **kwargs)
    except OSError as e:
        raise ModelNotFoundError(f"{what}={spec!r}: its weights cannot be loaded ({one_line(e)[:300]}); {FIX}") from e
    except RuntimeError as e:
        raise ModelLoadError(f"{what}={spec!r}: its weights do not fit its config.json ({one_line(e)[:300]})") from e
    missing = list(info.get("missing_keys") or [])
    if missing:
        raise ModelLoadError(f"{what}={spec!r}: its weights lack {len(missing)} tensors (e.g. {sorted(missing)[:3]}), "
                             f"which would start random; {FIX}")
    return model


def auto_config(source: str, what: str = "model.init_from") -> Any:
    """``AutoConfig.from_pretrained(source)`` (config.json only: no weights read), errors naming ``what``."""
    from transformers import AutoConfig

    if problem := missing_folder(source, what, FIX):  # else huggingface_hub's "Repo id must be in the form ..."
        raise ModelNotFoundError(problem)
    try:
        return AutoConfig.from_pretrained(str(Path(source).expanduser()) if looks_local(source) else source)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"{what}={source!r}: its config.json cannot be read ({one_line(e)[:300]}); {FIX}") from e


def write_meta(folder: Path, meta: dict[str, Any]) -> None:
    """Write a saved model's ``voxrelay.json`` atomically; callers write it last (the folder's commit)."""
    tmp = folder / (EXPORT_META + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2))
    tmp.replace(folder / EXPORT_META)


def read_meta(folder: Path, family: str, version: int) -> dict[str, Any]:
    """``voxrelay.json`` of a folder saved by ``family``, or an error naming the file and the fix."""
    path = folder / EXPORT_META
    if not path.is_file():
        raise ModelNotFoundError(
            f"{path} is missing: {folder} is not a complete voxrelay {family} folder "
            "(save_pretrained writes voxrelay.json last; an interrupted save leaves none)"
        )
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path} is not valid JSON ({e}); save the model again") from e
    if meta.get("format_version") != version:
        raise ModelLoadError(
            f"{path}: format_version {meta.get('format_version')!r} is not supported by this voxrelay "
            f"(expects {version}); load it with the voxrelay version that wrote it"
        )
    return meta
