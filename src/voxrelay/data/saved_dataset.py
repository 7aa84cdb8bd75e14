"""HF ``datasets`` data as the ``hf`` source reads it: a ``save_to_disk`` folder read through
:mod:`voxrelay.storage` (local, ``gs://`` or ``s3://`` alike), or a hub dataset loaded by ``datasets``.

A ``save_to_disk`` folder is ``state.json`` (its Arrow files), ``dataset_info.json`` (its features) and the
Arrow files themselves, in the IPC stream format ``datasets`` writes; a ``DatasetDict`` adds
``dataset_dict.json`` and one such folder per split. Reading the files batch by batch streams a dataset in a
bucket instead of copying it first (``datasets.load_from_disk`` downloads the whole folder). Audio columns
come back as ``datasets`` stores them (``{"bytes", "path"}``): decoding is left to
:mod:`voxrelay.data.audio` (soundfile, not torchcodec).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from voxrelay import storage
from voxrelay.data.sources import SourceError

DICT_FILE = "dataset_dict.json"
STATE_FILE = "state.json"
INFO_FILE = "dataset_info.json"
_ROWS_AT_ONCE = 64  # rows converted to Python at a time (a batch of audio rows can hold hundreds of MB)


@dataclass
class SavedDataset:
    """One split of a ``save_to_disk`` folder: ``uri`` its folder, ``files`` its Arrow files in order,
    ``features`` the ``datasets`` features (column -> feature dict, as in ``dataset_info.json``)."""

    uri: str
    files: list[str]
    features: dict[str, Any]

    @classmethod
    def open(cls, uri: str, split: str) -> SavedDataset:
        if storage.exists(storage.join(uri, DICT_FILE)):  # a DatasetDict: one folder per split
            splits = storage.read_json(storage.join(uri, DICT_FILE)).get("splits", [])
            if split not in splits:
                raise SourceError(f"{uri}: no split {split!r}; set `split` to one of {sorted(splits)}")
            uri = storage.join(uri, split)
        state_uri, info_uri = storage.join(uri, STATE_FILE), storage.join(uri, INFO_FILE)
        if not storage.exists(state_uri):
            raise SourceError(f"{uri}: no {STATE_FILE}; an hf source `path` is a folder written by "
                              "Dataset.save_to_disk or DatasetDict.save_to_disk")
        state = storage.read_json(state_uri)
        try:
            files = [storage.inside(uri, f["filename"]) for f in state["_data_files"]]
        except (KeyError, TypeError, storage.OutsideRoot) as err:
            raise SourceError(f"{state_uri}: not a save_to_disk state ({err}); save the dataset again") from None
        info = storage.read_json(info_uri) if storage.exists(info_uri) else {}
        return cls(uri, files, info.get("features") or {})

    @property
    def column_names(self) -> list[str]:
        if self.features or not self.files:
            return list(self.features)
        import pyarrow as pa

        with storage.open_read(self.files[0]) as f:
            return list(pa.ipc.open_stream(f).schema.names)

    def rows(self, columns: list[str]) -> Iterator[dict]:
        """Each row's ``columns`` as a dict, in order; one Arrow batch in memory at a time."""
        import pyarrow as pa

        for file in self.files:
            with storage.open_read(file) as f:
                for batch in pa.ipc.open_stream(f):
                    part = batch.select(columns)
                    for start in range(0, part.num_rows, _ROWS_AT_ONCE):
                        yield from part.slice(start, _ROWS_AT_ONCE).to_pylist()


@dataclass
class LoadedDataset:
    """A ``datasets.Dataset`` (a hub dataset), read the same way: audio left encoded."""

    ds: Any

    @property
    def column_names(self) -> list[str]:
        return list(self.ds.column_names)

    def rows(self, columns: list[str]) -> Iterator[dict]:
        import datasets

        ds = self.ds.select_columns(columns)
        for column in columns:
            # datasets 5 decodes Audio through torchcodec; keep the encoded bytes and use soundfile instead
            feature = ds.features[column]
            if isinstance(feature, datasets.Audio):
                ds = ds.cast_column(column, datasets.Audio(decode=False))
            elif isinstance(getattr(feature, "feature", None), datasets.Audio):  # List(Audio()): voice prompts
                ds = ds.cast_column(column, type(feature)(datasets.Audio(decode=False)))
        yield from ds
