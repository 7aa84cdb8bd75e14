"""The files of a whole-model checkpoint: writers that snapshot the weights (safetensors) and the training state at
the moment of the save (training goes on while they are written), and the reader of ``train_state.pt`` that
unpickles nothing but tensors and plain containers."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from safetensors.torch import save_file

from voxrelay.checkpoint.refusal import UnsafeCheckpoint, refusal
from voxrelay.checkpoint.staging import Writer


def model_writer(state: dict[str, torch.Tensor]) -> Writer:
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}
    return lambda path: save_file(tensors, str(path))


def state_writer(obj: dict) -> Writer:
    snapshot = _copy_tensors(obj)
    return lambda path: torch.save(snapshot, path)


def _copy_tensors(obj):
    """A copy of a nested state whose tensors no longer change as training goes on."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _copy_tensors(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_copy_tensors(v) for v in obj)
    return obj



def load_state(path: Path, mmap: bool = False, where: str | None = None) -> dict:
    """train_state.pt on the CPU, unpickling nothing but tensors and plain containers (``mmap``: tensors
    backed by the file's pages, read when used); ``where``: the file's name in errors (its URI in the bucket)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:  # what weights_only refuses: a global, a reduce that is not plain data
        raise UnsafeCheckpoint(f"{where or path} is refused: torch.load(weights_only=True) found more than tensors "
                               f"and plain containers in it ({refusal(err)}). voxrelay never runs code a checkpoint "
                               "file holds, and its saves never write such a file (someone who can write the bucket "
                               "may have planted it). Check who can write the run's folder, then delete this "
                               "checkpoint (or the run, with `voxrelay train --fresh`)") from None
