"""The tensors of a Hugging Face-style weights folder, in any of the layouts users bring: ``model.safetensors``
(or its shards), or pickled ``pytorch_model.bin`` (or its shards) as ``save_pretrained(safe_serialization=False)``
and accelerate's ``save_state(..., safe_serialization=False)`` write them (upstream Parler-TTS' training
``checkpoint-*`` folders).

A pickle can run code when it is loaded: ``pytorch_model.bin`` is read only with ``torch.load(...,
weights_only=True)``, and only a mapping of names to tensors is accepted.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch

from voxrelay.errors import one_line

SAFETENSORS = "model.safetensors"
PICKLE = "pytorch_model.bin"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS + ".index.json", PICKLE, PICKLE + ".index.json")


class WeightsFileError(ValueError):
    """A weights file that is missing, unreadable or not plain tensors; callers add the config key and the fix."""


def has_weights(folder: Path) -> bool:
    return any((folder / name).is_file() for name in WEIGHT_FILES)


def read_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``folder``: safetensors first (one file or the shards its index lists), else the pickle."""
    folder = Path(folder)
    for name in (SAFETENSORS, PICKLE):
        index = folder / (name + ".index.json")
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return {k: v for shard in shards for k, v in read_file(folder / shard).items()}
        if (folder / name).is_file():
            return read_file(folder / name)
    raise WeightsFileError(f"{str(folder)!r} holds no {SAFETENSORS} or {PICKLE} (nor their .index.json)")


def read_file(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one weights file: safetensors, or a pickle read as plain tensors only."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, TypeError, ValueError) as e:
        raise WeightsFileError(f"{path} is not plain tensors: torch.load(weights_only=True) refused it "
                               f"({one_line(e)[:200]}); voxrelay does not run the code a pickle may hold") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsFileError(f"{path} is not plain tensors (a {type(state).__name__} of other objects); "
                               "give a state dict of tensors")
    return dict(state)
