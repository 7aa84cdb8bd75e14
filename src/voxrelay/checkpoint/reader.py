"""Weights read from a checkpoint's ``model.safetensors`` straight into the tensors of a built model, one
tensor at a time, with plain file reads.

``safetensors.load_file`` builds a second copy of every weight (on top of the file's pages, mapped), which
a resume held beside the model until training started: on a GPU host, CPU memory at resume then exceeded a
fresh run's. Here each tensor's bytes go from the file into the model's own storage (``readinto``), or
through one temporary tensor when dtype or layout differ: a resume needs no memory a fresh start does not.
The format: 8 bytes (little-endian header length), a JSON header (name -> dtype, shape, byte offsets in the
data that follows), the data.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from voxrelay.checkpoint.store import CheckpointError

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


def read_header(path: Path) -> tuple[dict, int]:
    """(name -> {dtype, shape, data_offsets}, offset of the data) of a safetensors file."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


def read_into(path: Path, targets: dict[str, torch.Tensor], where: str, fix: str) -> None:
    """Copy every tensor of the safetensors file ``path`` into ``targets[name]`` (tensors sharing storage with
    a model's parameters, e.g. ``module.state_dict()``). The names must be exactly those of ``targets``
    (else CheckpointError naming them, then ``fix``), each with the target's shape."""
    header, start = read_header(path)
    missing, unexpected = sorted(targets.keys() - header.keys()), sorted(header.keys() - targets.keys())
    if missing or unexpected:
        raise CheckpointError(f"{where} does not hold the weights of this model: {len(missing)} tensors missing "
                              f"(e.g. {missing[:2]}), {len(unexpected)} unknown here (e.g. {unexpected[:2]}); {fix}")
    with open(path, "rb", buffering=0) as f:
        for name, meta in header.items():
            target, (begin, end) = targets[name], meta["data_offsets"]
            if list(target.shape) != list(meta["shape"]):
                raise CheckpointError(f"{where}: {name} has shape {meta['shape']}, this model's {list(target.shape)}; "
                                      f"{fix}")
            dtype = DTYPES[meta["dtype"]]
            direct = target.device.type == "cpu" and target.dtype == dtype and target.is_contiguous()
            buffer = target if direct else torch.empty(meta["shape"], dtype=dtype)
            f.seek(start + begin)
            if end > begin and _read_fully(f, buffer.reshape(-1).view(torch.uint8).numpy()) != end - begin:
                raise CheckpointError(f"{where}: {name} is cut short in {path.name}")
            if not direct:
                with torch.no_grad():
                    target.copy_(buffer)


def _read_fully(f, out) -> int:
    """readinto until ``out`` (a uint8 numpy array) is full or the file ends; the bytes read."""
    view, done = memoryview(out).cast("B"), 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            break
        done += n
    return done
