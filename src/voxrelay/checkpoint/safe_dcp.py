"""Sharded (DCP) checkpoints read without running code a bucket's writer may have planted.

torch.distributed.checkpoint's own reader unpickles ``.metadata`` with ``pickle.load`` and the BYTE_IO
entries of ``__*.distcp`` (an optimizer's ``param_groups`` values) with ``torch.load(weights_only=False)``:
a pickle can call any function when loaded, so whoever can write the bucket would run code on every
machine that resumes, exports or synthesizes. The manifest's sha256 does not help (the writer writes it too).

Here ``.metadata`` is unpickled by an unpickler that builds only the classes a real ``.metadata`` holds
(DCP's metadata records, ``torch.Size``, dtypes, layouts, paths: listed from files torch 2.13's DCP wrote),
and every storage entry must name a plain file of the folder; BYTE_IO entries are read with
``torch.load(weights_only=True)``. DCP's tensor entries are already read with ``weights_only=True``.
Why not DCP's safetensors options (torch 2.13): FileSystemWriter's safetensors format still pickles
``.metadata``; the Hugging Face storage reader, which does not, describes tensors only (no place for an
optimizer's ``param_groups``), so the optimizer state would need a second format beside it.
"""

from __future__ import annotations

import io
import pathlib
import pickle
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from voxrelay.checkpoint.format import DCP_METADATA  # noqa: F401 (defined in checkpoint/format.py)
from voxrelay.checkpoint.refusal import UnsafeCheckpoint, refusal  # noqa: F401 (imported from here too)
from voxrelay.checkpoint.store import CheckpointError

_META = "torch.distributed.checkpoint.metadata"
# (module, name) of every class or function a .metadata written by torch 2.13's DCP refers to; each builds
# plain records (no side effect), whatever arguments a forged file gives it
_ALLOWED = {
    (_META, "Metadata"), (_META, "TensorStorageMetadata"), (_META, "BytesStorageMetadata"),
    (_META, "ChunkStorageMetadata"), (_META, "TensorProperties"), (_META, "MetadataIndex"),
    (_META, "StorageMeta"), (_META, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict"),
}


def _refused(path: Path | str, what: str) -> UnsafeCheckpoint:
    return UnsafeCheckpoint(
        f"{path} is refused: {what}. voxrelay never runs code a checkpoint file holds; this file was not "
        "written by voxrelay's DCP save (someone who can write the bucket may have planted it). Check who can "
        "write the run's folder, then delete this checkpoint (or the run, with `voxrelay train --fresh`)")


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path | str):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise _refused(self.path, f"its pickle refers to {module}.{name}, which DCP metadata never holds")


def read_metadata(folder: Path, where: str | None = None) -> Metadata:
    """The ``.metadata`` of the DCP checkpoint in ``folder``, built from allowed classes only; every storage
    entry names a plain file of ``folder``. UnsafeCheckpoint (naming the file: in ``where``, the checkpoint's URI,
    if given) otherwise."""
    path = f"{where.rstrip('/')}/{DCP_METADATA}" if where else Path(folder) / DCP_METADATA
    try:
        with open(Path(folder) / DCP_METADATA, "rb") as f:
            meta = _MetadataUnpickler(f, path).load()
    except UnsafeCheckpoint:
        raise
    except Exception as err:  # whatever a malformed pickle makes the allowed classes raise: a damaged file
        raise CheckpointError(f"{path} is not DCP metadata ({type(err).__name__}: {err}); the checkpoint is "
                              "damaged: delete it so the previous one is used") from None
    if not isinstance(meta, Metadata) or not isinstance(meta.storage_data, dict):
        raise _refused(path, f"it holds a {type(meta).__name__}, not DCP Metadata")
    for info in meta.storage_data.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(info, _StorageInfo) or not isinstance(name, str) or pathlib.PurePath(name).name != name \
                or name in ("", ".", "..") or "\\" in name:
            raise _refused(path, f"a storage entry names {name!r}, not a file of its folder")
    return meta


class SafeReader(FileSystemReader):
    """DCP's file reader with :func:`read_metadata` (no arbitrary unpickling); use with :class:`SafeLoadPlanner`."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        if kwargs.get("rank") is not None:  # per-rank metadata files: never written by our saves
            raise _refused(Path(self.path), "per-rank metadata is not read by voxrelay")
        meta = read_metadata(Path(self.path))
        meta.storage_meta = meta.storage_meta or StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta

    def read_data(self, plan, planner):
        if not isinstance(planner, SafeLoadPlanner):  # DCP's default planner unpickles BYTE_IO entries freely
            raise TypeError("SafeReader reads only with a SafeLoadPlanner")
        return super().read_data(plan, planner)


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but BYTE_IO entries (non-tensor values such as an optimizer's
    ``param_groups``) are read with ``torch.load(weights_only=True)``."""

    def __init__(self, where: Path | str):
        super().__init__()
        self.where = where  # the checkpoint, in errors

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, TypeError, ValueError) as err:
            raise _refused(self.where, f"its entry {fqn!r} (in a __*.distcp file) is not plain data: "
                           f"torch.load(weights_only=True) refused it ({refusal(err)})") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def load(state: dict, folder: Path, process_group=None, where: str | None = None) -> None:
    """``dcp.load`` of ``state`` (filled in place) from ``folder`` through :class:`SafeReader`; a refused
    or damaged file raises CheckpointError naming it (on every rank alike: each reads the same files)."""
    read_metadata(folder, where)  # refused here, before DCP's collectives, with an error of our own
    try:
        dcp.load(state, storage_reader=SafeReader(str(folder)), planner=SafeLoadPlanner(where or folder),
                 process_group=process_group)
    except CheckpointException as err:  # DCP gathers each rank's failure into one exception: ours out
        for exc, _ in err.failures.values():
            if isinstance(exc, CheckpointError):
                raise exc from None
        raise
