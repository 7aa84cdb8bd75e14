"""Readers of the datasets users already have: ``SourceConfig`` -> a stream of :class:`Utterance`.

One reader per ``SourceConfig.type`` (see :data:`READERS`). Row-level problems never raise: the
row is yielded with ``problem`` set and ``where`` naming the file and row, so ``prepare`` can
report every bad row at once. Structural problems (no metadata file, an unknown header, a
broken JSONL line, a missing column) raise :class:`SourceError`; a source that is not there at all
raises :class:`SourceMissing`. Audio is not opened here: missing or corrupt audio is found by
:func:`voxrelay.data.audio.load_utterance_audio`.

Every location (``path``, the audio and text paths inside a source) may be a local path or a ``gs://`` /
``s3://`` URI: files are read through :mod:`voxrelay.storage`, line by line or by ranges, never copied
whole; a path inside a source must stay inside its folder (:func:`voxrelay.storage.inside`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from voxrelay import storage
from voxrelay.config import SourceConfig
from voxrelay.data.audio import AUDIO_BYTES_KEY
from voxrelay.data.types import Utterance
from voxrelay.data.voice_prompts import prompt_refs
from voxrelay.errors import UserError, one_line

METADATA = "metadata.csv"
_FOLDER_HEADER_HINT = (
    "the first line must be `id,audio_path,text_path` (optionally followed by `,num_speakers,duration_sec`) "
    "or `id,audio_path,text`, with optional `speaker`, `description`, `voice_prompts`, `conversation`, `turn` "
    "columns; paths are "
    "relative to the folder"
)


class SourceError(UserError, ValueError):
    """A source that cannot be read at all; the message names the file and the fix."""


class SourceMissing(SourceError):
    """A source whose ``path`` does not exist (a folder not on this machine, an object not in the bucket)."""


def _missing(location: str, what: str) -> SourceMissing:
    scheme = re.match(r"^([a-z][a-z0-9]+):/(?!/)", location)  # "s3:/b/x": a URI that went through a Path
    hint = f"; a bucket location is written {scheme.group(1)}://bucket/path" if scheme else ""
    return SourceMissing(f"{location}: not found; {what}{hint}")


def _inside(root: str, raw: str) -> tuple[str | None, str | None]:
    """Where ``raw`` (relative to ``root``, or absolute) is -> (location, None) or (None, reason)."""
    try:
        return storage.inside(root, raw), None
    except storage.OutsideRoot as err:
        return None, str(err)


def _read_text_file(root: str, raw: str) -> tuple[str | None, str | None]:
    """The stripped UTF-8 content of a transcript file -> (text, None) or (None, reason)."""
    path, reason = _inside(root, raw)
    if path is None:
        return None, reason
    try:
        return storage.read_bytes(path).decode("utf-8-sig").strip(), None
    except FileNotFoundError:
        return None, f"text file missing: {raw}"
    except UnicodeDecodeError:
        return None, f"text file {raw} is not UTF-8; re-save it as UTF-8"
    except IsADirectoryError:
        return None, f"text file {raw} is a folder"
    except OSError as e:
        return None, f"text file {raw} is unreadable ({e.strerror or e})"


def _open_lines(location: str):
    """A text file of a source (local or in a bucket), read as it is iterated; a BOM is dropped
    (spreadsheet programs often prepend one, which would corrupt the first column's name)."""
    return io.TextIOWrapper(storage.open_read(location), encoding="utf-8-sig", newline="")


def _folder_row(root: str, row: dict, where: str, n_fields: int) -> Utterance:
    """One metadata.csv row -> Utterance (``problem`` set when the row is bad)."""
    extra_values = row.pop(None, None)  # csv.DictReader puts surplus values under the key None
    get = {k: (v or "").strip() for k, v in row.items() if k is not None}
    utt = Utterance(id=get.get("id") or "", text="", where=where)
    if extra_values:
        utt.problem = (
            f"row has {n_fields + len(extra_values)} values but the header has {n_fields}; "
            "put double quotes around text that contains commas"
        )
    missing = [k for k in ("id", "audio_path") if not get.get(k)]
    if not get.get("text") and not get.get("text_path"):
        missing.append("text" if "text" in get else "text_path")
    if missing:
        utt.problem = utt.problem or f"missing field(s): {', '.join(missing)}"
        return utt
    audio, reason = _inside(root, get["audio_path"])
    utt.audio_path = str(audio) if audio else None
    text, text_reason = (get["text"], None) if get.get("text") else _read_text_file(root, get["text_path"])
    utt.text = text or ""
    utt.speaker = get.get("speaker") or None
    utt.description = get.get("description") or None
    utt.voice_prompts = prompt_refs(get.get("voice_prompts"), lambda p: _inside(root, p), utt,
                                    "voice_prompts")
    _set_turn(utt, get.get("conversation") or None, get.get("turn") or None, "turn")
    if get.get("duration_sec"):
        utt.extra["duration_sec"] = get["duration_sec"]
    if get.get("num_speakers"):
        try:
            utt.num_speakers = int(get["num_speakers"])
        except ValueError:
            reason = reason or f"num_speakers {get['num_speakers']!r} is not a whole number"
    if not utt.problem:
        utt.problem = reason or text_reason or (None if utt.text else "empty text")
    return utt


def read_folder(path: str | Path) -> Iterator[Utterance]:
    """``<path>/metadata.csv`` (comma-separated, with a header) + the audio/text files it names.

    ``where`` is ``"<path>/metadata.csv row N"`` with N the line in the file (header = row 1).
    """
    root = str(path)
    meta = storage.join(root, METADATA)
    if not storage.exists(meta):
        if not storage.exists(root):
            raise _missing(root, f"a folder source needs a folder with a {METADATA}")
        raise SourceError(f"{meta}: not found; a folder source needs a {METADATA}: {_FOLDER_HEADER_HINT}")
    try:
        with _open_lines(meta) as f:
            reader = csv.DictReader(f, skipinitialspace=True)
            fields = [(name or "").strip() for name in (reader.fieldnames or [])]
            reader.fieldnames = fields
            if "id" not in fields or "audio_path" not in fields or not {"text", "text_path"} & set(fields):
                raise SourceError(f"{meta}: header {','.join(fields)!r} is not recognised; {_FOLDER_HEADER_HINT}")
            for row in reader:
                if not any((v or "").strip() for k, v in row.items() if k is not None) and None not in row:
                    continue  # blank line
                yield _folder_row(root, row, f"{meta} row {reader.line_num}", len(fields))
    except UnicodeDecodeError as e:
        raise SourceError(f"{meta}: not UTF-8 ({e.reason} at byte {e.start}); re-save it as UTF-8") from None
    except csv.Error as e:
        raise SourceError(f"{meta}: not a valid CSV file ({e}); {_FOLDER_HEADER_HINT}") from None


def _read_folder_source(src: SourceConfig, workdir: Path) -> Iterator[Utterance]:
    return read_folder(src.path)


def _read_ljspeech(src: SourceConfig, workdir: Path) -> Iterator[Utterance]:
    """LJSpeech layout: ``metadata.csv`` lines ``id|text|normalized_text`` (no header), ``wavs/<id>.wav``."""
    root = str(src.path)
    meta = storage.join(root, METADATA)
    if not storage.exists(meta):
        if not storage.exists(root):
            raise _missing(root, "an ljspeech source needs a folder with metadata.csv and wavs/")
        raise SourceError(f"{meta}: not found; an ljspeech source needs metadata.csv (id|text|normalized_text)")
    try:
        with _open_lines(meta) as f:
            first = True
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                if first and "|" not in line:
                    raise SourceError(
                        f"{meta}: first line has no '|' so this is not LJSpeech's id|text|normalized_text; "
                        "for a comma-separated metadata.csv with a header use `type: folder`"
                    )
                first = False
                yield _ljspeech_row(root, line, f"{meta} row {n}")
    except UnicodeDecodeError as e:
        raise SourceError(f"{meta}: not UTF-8 ({e.reason} at byte {e.start}); re-save it as UTF-8") from None


def _ljspeech_row(root: str, line: str, where: str) -> Utterance:
    parts = [p.strip() for p in line.rstrip("\r\n").split("|")]
    utt = Utterance(id=parts[0], text="", where=where)
    if not parts[0]:
        utt.problem = "missing field: id"
        return utt
    utt.audio_path, utt.problem = _inside(root, f"wavs/{parts[0]}.wav")
    # the normalised column spells out numbers and abbreviations: what the audio says
    utt.text = next((p for p in reversed(parts[1:3]) if p), "")
    if len(parts) < 2:
        utt.problem = utt.problem or "missing field: text (expected id|text|normalized_text)"
    elif not utt.text:
        utt.problem = utt.problem or "empty text"
    return utt


def _jsonl_audio(utt: Utterance, root: str, value: object, column: str) -> None:
    """Fill the audio of ``utt`` from a JSONL value: a path, ``{"path"}`` or ``{"array", "sampling_rate"}``."""
    if isinstance(value, dict) and value.get("array") is not None:
        utt.audio = np.asarray(value["array"], dtype=np.float32)
        utt.sample_rate = value.get("sampling_rate") or value.get("sample_rate")
        return
    raw = value.get("path") if isinstance(value, dict) else value
    if not isinstance(raw, str) or not raw.strip():
        utt.problem = f"missing field: {column} (a path relative to the .jsonl file)"
        return
    audio, utt.problem = _inside(root, raw.strip())
    utt.audio_path = str(audio) if audio else None


def _read_jsonl(src: SourceConfig, workdir: Path) -> Iterator[Utterance]:
    """One JSON object per line with the columns named by ``src.*_column``."""
    path = str(src.path)
    if not storage.exists(path):
        raise _missing(path, "a jsonl source needs `path` to name a .jsonl file")
    root, stem = storage.parent(path), storage.basename(path).rsplit(".", 1)[0]
    with _open_lines(path) as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise SourceError(
                    f"{path} line {n}: not valid JSON ({e.msg}); each line must be one JSON object"
                ) from None
            if not isinstance(obj, dict):
                raise SourceError(f"{path} line {n}: a {type(obj).__name__}, not a JSON object")
            text = obj.get(src.text_column)
            utt = Utterance(id=str(obj.get("id") or f"{stem}-{n}"), text="", where=f"{path} line {n}")
            utt.text = text.strip() if isinstance(text, str) else ""
            utt.speaker = _optional_str(obj, src.speaker_column)
            utt.description = _optional_str(obj, src.description_column)
            _jsonl_audio(utt, root, obj.get(src.audio_column), src.audio_column)
            _set_turn(utt, _optional_str(obj, src.conversation_column),
                      obj.get(src.turn_column) if src.turn_column else None, src.turn_column)
            if src.voice_prompts_column:
                utt.voice_prompts = prompt_refs(obj.get(src.voice_prompts_column), lambda p: _inside(root, p),
                                                utt, src.voice_prompts_column)
            if not utt.problem and not isinstance(text, str):
                utt.problem = f"missing field: {src.text_column}"
            elif not utt.problem and not utt.text:
                utt.problem = "empty text"
            yield utt


def _set_turn(utt: Utterance, conversation: str | None, turn: object, column: str | None) -> None:
    """The row's conversation and its turn in it (a whole number, or absent: ordered by id); a bad turn sets
    ``problem``."""
    utt.conversation = conversation
    if turn is None or turn == "":
        return
    try:
        if isinstance(turn, bool) or float(turn) != int(float(turn)):
            raise ValueError
        utt.turn = int(float(turn))
    except (TypeError, ValueError):
        utt.problem = utt.problem or f"{column} {turn!r} is not a whole number (the row's place in its conversation)"


def _optional_str(obj: dict, column: str | None) -> str | None:
    value = obj.get(column) if column else None
    if value is None:
        return None
    return str(value).strip() or None


def _load_hf(src: SourceConfig):
    """The rows of ``src.split``: a save_to_disk folder (``path``, local or in a bucket) or a hub dataset."""
    from voxrelay.data.saved_dataset import LoadedDataset, SavedDataset

    if src.path:
        if not storage.exists(src.path):
            raise _missing(src.path, "an hf source `path` is a folder written by save_to_disk")
        return SavedDataset.open(src.path, src.split)
    import datasets

    try:
        ds = datasets.load_dataset(src.hub_id, src.hub_config, split=src.split)
    except (OSError, ValueError) as err:  # offline (ConnectionError), not on the hub, a config/split it lacks
        raise SourceError(
            f"hf source hub_id={src.hub_id!r} (config {src.hub_config!r}, split {src.split!r}) cannot be loaded: "
            f"{type(err).__name__}: {one_line(err)[:300]}; check the network (or HF_HUB_OFFLINE and a warm "
            "Hugging Face cache), the id, hub_config and split, or save the dataset with save_to_disk and give its "
            "folder as `path` (a bucket folder works)") from None
    if isinstance(ds, datasets.DatasetDict):
        if src.split not in ds:
            raise SourceError(f"{src.hub_id}: no split {src.split!r}; set `split` to one of {sorted(ds)}")
        ds = ds[src.split]
    return LoadedDataset(ds)


_EMBED_HINT = "or embed the audio in the dataset (cast the column to datasets.Audio() before save_to_disk)"


def _hub_roots() -> list[Path]:
    """Where the audio files of a hub dataset's row without bytes may be: the Hugging Face caches its files
    were downloaded to."""
    import datasets
    from huggingface_hub import constants

    return [Path(datasets.config.HF_DATASETS_CACHE), Path(constants.HF_HUB_CACHE)]


def _hf_audio_path(raw: str, src: SourceConfig) -> tuple[str | None, str | None]:
    """An hf row's audio path, checked like the other sources' -> (path, None) or (None, reason): inside the
    save_to_disk folder (relative paths resolve against it), or inside the caches of a hub dataset."""
    if src.path:
        path, reason = _inside(src.path, raw)
        return path, reason and f"audio {reason}; keep the audio files inside it, {_EMBED_HINT}"
    roots = _hub_roots()
    try:
        resolved = (Path(raw) if Path(raw).is_absolute() else roots[0] / raw).resolve()  # symlinks too
    except (OSError, ValueError, RuntimeError) as err:  # a NUL byte, a symlink loop
        return None, f"audio path {raw!r} is not usable ({err})"
    if any(resolved.is_relative_to(root.resolve()) for root in roots):
        return str(resolved), None
    where = " or ".join(repr(str(r)) for r in roots)
    return None, f"audio path {raw!r} is outside the dataset folder {where}; keep the audio files inside it, " \
        + _EMBED_HINT


def _metadata(src: SourceConfig) -> dict[str, str | None] | None:
    """id -> description of the metadata dataset joined to an hf source (upstream Parler's
    ``*_metadata_dataset_name``), or None without one."""
    if not (src.metadata_path or src.metadata_hub_id):
        return None
    meta_src = src.model_copy(update={"path": src.metadata_path, "hub_id": src.metadata_hub_id,
                                      "hub_config": src.metadata_config or src.hub_config,
                                      "split": src.metadata_split or src.split})
    ds = _load_hf(meta_src)
    label = f"metadata {src.metadata_path or src.metadata_hub_id}[{meta_src.split}]"
    for column, key in ((src.id_column, "id_column"), (src.description_column, "description_column")):
        if not column or column not in ds.column_names:
            raise SourceError(f"{label}: no column {column!r} to join on; set `{key}` to one of {ds.column_names}")
    return {str(row[src.id_column]): _optional_str(row, src.description_column)
            for row in ds.rows([src.id_column, src.description_column])}


def _read_hf(src: SourceConfig, workdir: Path) -> Iterator[Utterance]:
    """A HF datasets dataset with an audio column; audio stays encoded until ``load_utterance_audio``.
    With a metadata dataset, each row's description comes from the metadata row of the same id."""
    ds = _load_hf(src)
    descriptions = _metadata(src)
    label = f"{src.path or src.hub_id}[{src.split}]"
    for column, key in ((src.audio_column, "audio_column"), (src.text_column, "text_column")):
        if column not in ds.column_names:
            raise SourceError(f"{label}: no column {column!r}; set `{key}` to one of {ds.column_names}")
    if descriptions is not None and src.id_column not in ds.column_names:
        raise SourceError(f"{label}: no column {src.id_column!r} to join the metadata on; set `id_column` to one of "
                          f"{ds.column_names}")
    optional = [c for c in (src.id_column, src.speaker_column, src.description_column, src.voice_prompts_column,
                            src.conversation_column, src.turn_column)
                if c and c in ds.column_names and (descriptions is None or c != src.description_column)]
    for i, row in enumerate(ds.rows(list(dict.fromkeys([src.audio_column, src.text_column, *optional])))):
        text = row.get(src.text_column)
        utt = Utterance(id=str(row.get(src.id_column) or f"{src.split}-{i}"), text="", where=f"{label} row {i}")
        utt.text = text.strip() if isinstance(text, str) else ""
        utt.speaker = _optional_str(row, src.speaker_column)
        utt.description = _optional_str(row, src.description_column) if descriptions is None else \
            descriptions.get(utt.id)
        _set_turn(utt, _optional_str(row, src.conversation_column),
                  row.get(src.turn_column) if src.turn_column else None, src.turn_column)
        value = row.get(src.audio_column)
        if isinstance(value, dict) and value.get("bytes"):
            utt.extra[AUDIO_BYTES_KEY] = value["bytes"]
        elif isinstance(value, dict) and value.get("array") is not None:
            utt.audio, utt.sample_rate = np.asarray(value["array"], np.float32), value.get("sampling_rate")
        elif isinstance(value, dict | str) and (value.get("path") if isinstance(value, dict) else value):
            raw = value.get("path") if isinstance(value, dict) else value
            utt.audio_path, utt.problem = _hf_audio_path(str(raw), src)
        else:
            utt.problem = f"missing field: {src.audio_column}"
        if src.voice_prompts_column:
            utt.voice_prompts = prompt_refs(row.get(src.voice_prompts_column), lambda p: _hf_audio_path(p, src),
                                            utt, src.voice_prompts_column)
        if not utt.problem and not utt.text:
            utt.problem = "empty text" if isinstance(text, str) else f"missing field: {src.text_column}"
        yield utt


def demo_folder(src: SourceConfig, workdir: str | Path) -> Path:
    """Where the demo corpus of ``src`` lives: one folder per (seed, minutes, voices)."""
    voices_tag = hashlib.sha256(json.dumps(src.voices).encode()).hexdigest()[:8]
    layout = "" if src.layout == "sentences" else f"-{src.layout}"
    return Path(workdir) / f"demo-{src.seed}-{src.minutes:g}min-{voices_tag}{layout}"


def _read_demo(src: SourceConfig, workdir: Path) -> Iterator[Utterance]:
    from voxrelay.data.demo_corpus import generate_demo_corpus

    folder = generate_demo_corpus(demo_folder(src, workdir), minutes=src.minutes, voices=src.voices, seed=src.seed,
                                   layout=src.layout)
    return read_folder(folder)


READERS: dict[str, Callable[[SourceConfig, Path], Iterator[Utterance]]] = {
    "folder": _read_folder_source,
    "ljspeech": _read_ljspeech,
    "jsonl": _read_jsonl,
    "hf": _read_hf,
    "demo": _read_demo,
}


def read_source(src: SourceConfig, workdir: str | Path) -> Iterator[Utterance]:
    """Stream the utterances of one source. ``workdir`` is a local scratch folder (demo corpora).

    Structural problems raise :class:`SourceError` on the first ``next()``; bad rows come back
    with ``Utterance.problem`` set.
    """
    reader = READERS.get(src.type)
    if reader is None:
        raise SourceError(f"unknown source type {src.type!r}; use one of {sorted(READERS)}")
    yield from reader(src, Path(workdir))
