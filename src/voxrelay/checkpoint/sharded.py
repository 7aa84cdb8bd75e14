"""Sharded checkpoints (``train.strategy=fsdp``): the files torch.distributed.checkpoint (DCP) writes.

Such a checkpoint folder holds, beside ``train_state.pt``, DCP's ``__<rank>_<i>.distcp`` files (each rank
writes its own shards of the model and optimizer state) and ``.metadata`` (which shard holds which part of
which tensor; rank 0 writes it once every rank has written). The manifest lists every one of them with its
sha256 and says ``"sharded": "dcp"``. DCP reshards on load, so a checkpoint written by N processes loads
into M. Plain file names only: the folder stays flat, as :func:`~voxrelay.checkpoint.store.check_manifest`
requires.
Both are read through :mod:`voxrelay.checkpoint.safe_dcp`, never DCP's own reader (it unpickles freely).
"""

from __future__ import annotations

from pathlib import Path

import torch

from voxrelay.checkpoint.format import DCP, DCP_METADATA, SHARDED  # noqa: F401 (imported from here by others)

MODEL_KEY, OPTIM_KEY = "model", "optim"  # top-level keys of the DCP state


def is_sharded(manifest: dict) -> bool:
    return manifest.get(SHARDED) == DCP


def rank_files(folder: Path, rank: int) -> list[Path]:
    """The shard files DCP's FileSystemWriter wrote for ``rank`` (``__<rank>_<i>.distcp``)."""
    return sorted(folder.glob(f"__{rank}_*.distcp"))


def read_model(folder: Path, where: str | None = None) -> dict[str, torch.Tensor]:
    """The whole model state (full tensors on the CPU, by their names in the module) of a sharded checkpoint,
    in this process without a process group: only the model's shards are read, not the optimizer's
    (for export and synthesis of a model trained with FSDP). ``where``: the checkpoint's URI, for errors."""
    import warnings

    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from voxrelay.checkpoint import safe_dcp

    prefix = MODEL_KEY + "."
    meta = safe_dcp.read_metadata(folder, where).state_dict_metadata
    model = {key[len(prefix):]: torch.empty(m.size, dtype=m.properties.dtype) for key, m in meta.items()
             if key.startswith(prefix) and isinstance(m, TensorStorageMetadata)}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*load in a single process.*")
        safe_dcp.load({MODEL_KEY: model}, folder, where=where)
    return model
