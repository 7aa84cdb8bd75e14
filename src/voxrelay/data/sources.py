"""Readers of the datasets users already have: ``SourceConfig`` -> a stream of :class:`Utterance`.

One reader per ``SourceConfig.type`` (see :data:`READERS`). Row-level problems never raise: the
row is yielded with ``problem`` set and ``where`` naming the file and row, so ``prepare`` can
report every bad row at once. Structural problems (no metadata file, an unknown header, a
broken JSONL line, a missing column) raise :class:`SourceError`. Audio is not opened here:
missing or corrupt audio is found by :func:`voxrelay.data.audio.load_utterance_audio`.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from voxrelay.config import SourceConfig
from voxrelay.data.audio import AUDIO_BYTES_KEY
from voxrelay.data.types import Utterance
from voxrelay.data.voice_prompts import prompt_refs
from voxrelay.errors import UserError

METADATA = "metadata.csv"
_FOLDER_HEADER_HINT = (
    "the first line must be `id,audio_path,text_path` (optionally followed by `,num_speakers,duration_sec`) "
    "or `id,audio_path,text`, with optional `speaker`, `description`, `voice_prompts` columns; paths are "
    "relative to the folder"
)


class SourceError(UserError, ValueError):
    """A source that cannot be read at all; the message names the file and the fix."""


def _inside(root: Path, raw: str) -> tuple[Path | None, str | None]:
    """Resolve ``raw`` (relative to ``root``, or absolute) -> (path, None) or (None, reason).

    Symlinks are resolved first so that a link pointing outside cannot smuggle in other files.
    """
    candidate = Path(raw) if Path(raw).is_absolute() else root / raw
    try:
        resolved = candidate.resolve()
    except (OSError, ValueError, RuntimeError) as err:  # a NUL byte, a symlink loop
        return None, f"path {raw!r} is not usable ({err})"
    if not resolved.is_relative_to(root.resolve()):
        return None, f"path {raw!r} is outside the dataset folder {str(root)!r}; keep files inside it"
    return resolved, None


def _as_str(found: tuple[Path | None, str | None]) -> tuple[str | None, str | None]:
    path, reason = found
    return (str(path) if path else None), reason


def _read_text_file(root: Path, raw: str) -> tuple[str | None, str | None]:
    """The stripped UTF-8 content of a transcript file -> (text, None) or (None, reason)."""
    path, reason = _inside(root, raw)
    if path is None:
        return None, reason
    try:
        return path.read_text(encoding="utf-8-sig").strip(), None
    except FileNotFoundError:
        return None, f"text file missing: {raw}"
    except UnicodeDecodeError:
        return None, f"text file {raw} is not UTF-8; re-save it as UTF-8"
    except OSError as e:
        return None, f"text file {raw} is unreadable ({e.strerror or e})"


def _folder_row(root: Path, row: dict, where: str, n_fields: int) -> Utterance:
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
    utt.voice_prompts = prompt_refs(get.get("voice_prompts"), lambda p: _as_str(_inside(root, p)), utt,
                                    "voice_prompts")
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
    root = Path(path)
    meta = root / METADATA
    if not meta.is_file():
        raise SourceError(f"{meta}: not found; a folder source needs a {METADATA}: {_FOLDER_HEADER_HINT}")
    try:
        # utf-8-sig: spreadsheet programs often prepend a BOM, which would corrupt the name "id"
        with open(meta, encoding="utf-8-sig", newline="") as f:
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
    root = Path(src.path)
    meta = root / METADATA
    if not meta.is_file():
        raise SourceError(f"{meta}: not found; an ljspeech source needs metadata.csv (id|text|normalized_text)")
    try:
        lines = meta.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as e:
        raise SourceError(f"{meta}: not UTF-8 ({e.reason} at byte {e.start}); re-save it as UTF-8") from None
    first = next((line for line in lines if line.strip()), "")
    if first and "|" not in first:
        raise SourceError(
            f"{meta}: first line has no '|' so this is not LJSpeech's id|text|normalized_text; "
            "for a comma-separated metadata.csv with a header use `type: folder`"
        )
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split("|")]
        utt = Utterance(id=parts[0], text="", where=f"{meta} row {n}")
        if not parts[0]:
            utt.problem = "missing field: id"
        else:
            audio, utt.problem = _inside(root, f"wavs/{parts[0]}.wav")
            utt.audio_path = str(audio) if audio else None
            # the normalised column spells out numbers and abbreviations: what the audio says
            utt.text = next((p for p in reversed(parts[1:3]) if p), "")
            if len(parts) < 2:
                utt.problem = utt.problem or "missing field: text (expected id|text|normalized_text)"
            elif not utt.text:
                utt.problem = utt.problem or "empty text"
        yield utt


def _jsonl_audio(utt: Utterance, root: Path, value: object, column: str) -> None:
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
    path = Path(src.path)
    if not path.is_file():
        raise SourceError(f"{path}: not found; a jsonl source needs `path` to name a .jsonl file")
    root = path.parent
    with open(path, encoding="utf-8-sig") as f:
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
            utt = Utterance(id=str(obj.get("id") or f"{path.stem}-{n}"), text="", where=f"{path} line {n}")
            utt.text = text.strip() if isinstance(text, str) else ""
            utt.speaker = _optional_str(obj, src.speaker_column)
            utt.description = _optional_str(obj, src.description_column)
            _jsonl_audio(utt, root, obj.get(src.audio_column), src.audio_column)
            if src.voice_prompts_column:
                utt.voice_prompts = prompt_refs(obj.get(src.voice_prompts_column), lambda p: _as_str(_inside(root, p)),
                                                utt, src.voice_prompts_column)
            if not utt.problem and not isinstance(text, str):
                utt.problem = f"missing field: {src.text_column}"
            elif not utt.problem and not utt.text:
                utt.problem = "empty text"
            yield utt


def _optional_str(obj: dict, column: str | None) -> str | None:
    value = obj.get(column) if column else None
    if value is None:
        return None
    return str(value).strip() or None


def _load_hf(src: SourceConfig):
    """The Dataset of ``src.split`` from ``load_from_disk`` or the hub (imported lazily)."""
    import datasets

    if src.path:
        if not Path(src.path).exists():
            raise SourceError(f"{src.path}: not found; an hf source `path` is a folder written by save_to_disk")
        ds = datasets.load_from_disk(src.path)
    else:
        ds = datasets.load_dataset(src.hub_id, src.hub_config, split=src.split)
    if isinstance(ds, datasets.DatasetDict):
        if src.split not in ds:
            raise SourceError(f"{src.path}: no split {src.split!r}; set `split` to one of {sorted(ds)}")
        ds = ds[src.split]
    return ds


def _hf_roots(src: SourceConfig) -> list[Path]:
    """Where the audio files of an hf row without bytes may be: inside the load_from_disk folder,
    or, for a hub dataset, inside the Hugging Face caches its files were downloaded to."""
    if src.path:
        return [Path(src.path)]
    import datasets
    from huggingface_hub import constants

    return [Path(datasets.config.HF_DATASETS_CACHE), Path(constants.HF_HUB_CACHE)]


def _hf_audio_path(raw: str, roots: list[Path]) -> tuple[str | None, str | None]:
    """An hf row's audio path, checked like the other sources' -> (path, None) or (None, reason).

    A shared dataset must not make ``prepare`` read (and upload into shards) other files of this
    machine: relative paths resolve against the first root, and the result must lie inside a root.
    """
    try:
        resolved = (Path(raw) if Path(raw).is_absolute() else roots[0] / raw).resolve()  # symlinks too
    except (OSError, ValueError, RuntimeError) as err:  # a NUL byte, a symlink loop
        return None, f"audio path {raw!r} is not usable ({err})"
    if any(resolved.is_relative_to(root.resolve()) for root in roots):
        return str(resolved), None
    where = " or ".join(repr(str(r)) for r in roots)
    return None, (
        f"audio path {raw!r} is outside the dataset folder {where}; keep the audio files inside it, or embed "
        "the audio in the dataset (cast the column to datasets.Audio() before save_to_disk)"
    )


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
    ds = ds.select_columns([src.id_column, src.description_column])
    return {str(row[src.id_column]): _optional_str(row, src.description_column) for row in ds}


def _read_hf(src: SourceConfig, workdir: Path) -> Iterator[Utterance]:
    """A HF datasets Dataset with an audio column; audio stays encoded until ``load_utterance_audio``.
    With a metadata dataset, each row's description comes from the metadata row of the same id."""
    import datasets

    ds = _load_hf(src)
    descriptions = _metadata(src)
    label = f"{src.path or src.hub_id}[{src.split}]"
    for column, key in ((src.audio_column, "audio_column"), (src.text_column, "text_column")):
        if column not in ds.column_names:
            raise SourceError(f"{label}: no column {column!r}; set `{key}` to one of {ds.column_names}")
    if descriptions is not None and src.id_column not in ds.column_names:
        raise SourceError(f"{label}: no column {src.id_column!r} to join the metadata on; set `id_column` to one of "
                          f"{ds.column_names}")
    optional = [c for c in (src.id_column, src.speaker_column, src.description_column, src.voice_prompts_column)
                if c and c in ds.column_names and (descriptions is None or c != src.description_column)]
    ds = ds.select_columns([src.audio_column, src.text_column, *optional])
    if isinstance(ds.features[src.audio_column], datasets.Audio):
        # datasets 5 decodes Audio through torchcodec; keep the encoded bytes and use soundfile instead
        ds = ds.cast_column(src.audio_column, datasets.Audio(decode=False))
    ds = _undecoded_prompts(ds, src.voice_prompts_column)
    roots = _hf_roots(src)
    for i, row in enumerate(ds):
        text = row.get(src.text_column)
        utt = Utterance(id=str(row.get(src.id_column) or f"{src.split}-{i}"), text="", where=f"{label} row {i}")
        utt.text = text.strip() if isinstance(text, str) else ""
        utt.speaker = _optional_str(row, src.speaker_column)
        utt.description = _optional_str(row, src.description_column) if descriptions is None else \
            descriptions.get(utt.id)
        value = row.get(src.audio_column)
        if isinstance(value, dict) and value.get("bytes"):
            utt.extra[AUDIO_BYTES_KEY] = value["bytes"]
        elif isinstance(value, dict) and value.get("array") is not None:
            utt.audio, utt.sample_rate = np.asarray(value["array"], np.float32), value.get("sampling_rate")
        elif isinstance(value, dict | str) and (value.get("path") if isinstance(value, dict) else value):
            raw = value.get("path") if isinstance(value, dict) else value
            utt.audio_path, utt.problem = _hf_audio_path(str(raw), roots)
        else:
            utt.problem = f"missing field: {src.audio_column}"
        if src.voice_prompts_column:
            utt.voice_prompts = prompt_refs(row.get(src.voice_prompts_column), lambda p: _hf_audio_path(p, roots),
                                            utt, src.voice_prompts_column)
        if not utt.problem and not utt.text:
            utt.problem = "empty text" if isinstance(text, str) else f"missing field: {src.text_column}"
        yield utt


def _undecoded_prompts(ds, column: str | None):
    """``ds`` with a voice-prompts column of Audio (or a list of Audio) left encoded, as the audio column is."""
    import datasets

    feature = ds.features.get(column) if column else None
    if isinstance(feature, datasets.Audio):
        return ds.cast_column(column, datasets.Audio(decode=False))
    if isinstance(getattr(feature, "feature", None), datasets.Audio):  # List(Audio()) / Sequence(Audio())
        return ds.cast_column(column, type(feature)(datasets.Audio(decode=False)))
    return ds


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
