"""Parquet shard format of prepared data and the ``index.json`` that commits it.

Layout of ``<root>/prepared/<data.name>/``::

    codec.safetensors          fitted codec state (built-in codec only)
    shards/train-00000.parquet one row per utterance (columns below)
    shards/train-00000.done    JSON marker written after the shard: rows, rejects, seconds
    rejects.jsonl              every rejected row with its reason
    index.json                 written LAST: shards (name, split, rows, seconds, sha256 of the Parquet file:
                               absent in data prepared by older versions), counts, hours, codec; no index, no dataset

Columns: id, text, speaker, description (str), duration (float32, seconds), num_frames (int32),
codes (binary: int16 [K, T] row-major, K = index["num_codebooks"]), ref_audio (binary: int16 PCM
at the codec's sample rate; eval split only, empty for train: the reference MCD-DTW scores against),
voice_prompts (list of binary: each clip's codes, int16 [K, T] row-major, one per speaker of the transcript, for a
family that clones voices from prompts; empty otherwise and absent in shards of older versions), conversation (str)
and turn (int32): the conversation a row is a turn of, for a family that takes previous turns as context (null
otherwise, absent in shards of older versions).
A codec whose arrays are features, not codes (``stored_dtype``, e.g. a family's precomputed latents), stores codes
and voice prompts as float32 instead, and a codec of more than 32,768 codes per codebook (``stored_dtype = "int32"``)
as int32; the Parquet schema's metadata names the dtype (``voxrelay.codes_dtype``, absent: int16).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from voxrelay import storage
from voxrelay.errors import UserError

INDEX_FILE = "index.json"
CODEC_STATE_FILE = "codec.safetensors"
REJECTS_FILE = "rejects.jsonl"
SHARD_DIR = "shards"
FORMAT_VERSION = 1
DTYPE_KEY = b"voxrelay.codes_dtype"
STORED_DTYPES = ("int16", "int32", "float32")

SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text", pa.string()),
        ("speaker", pa.string()),
        ("description", pa.string()),
        ("duration", pa.float32()),
        ("num_frames", pa.int32()),
        ("codes", pa.binary()),
        ("ref_audio", pa.binary()),
        ("voice_prompts", pa.list_(pa.binary())),
        ("conversation", pa.string()),
        ("turn", pa.int32()),
    ]
)


class PrepareError(UserError, RuntimeError):
    """prepare cannot go on, or prepared data is missing; the message names the row/file and the fix."""


def load_index(prepared_uri: str) -> dict:
    """The committed index of prepared data, or a clear error telling to run prepare."""
    uri = storage.join(prepared_uri, INDEX_FILE)
    if not storage.exists(uri):
        raise PrepareError(f"no prepared data at {prepared_uri} (no index.json); run `voxrelay prepare CONFIG` first")
    index = storage.read_json(uri)
    for shard in index.get("shards", []) if isinstance(index, dict) else []:  # names joined to cache folders
        storage.check_name(shard.get("name") if isinstance(shard, dict) else shard, uri, single=True)
    return index


@dataclass
class EncodedUtterance:
    id: str
    text: str
    speaker: str | None
    description: str | None
    duration: float
    codes: np.ndarray  # int16 [K, T] (float32 for a codec of features, see stored_array)
    ref_audio: np.ndarray | None = None  # float32 [N] at the codec rate (eval split only)
    voice_prompts: tuple[np.ndarray, ...] = ()  # int16 [K, T] per speaker, in the order of its labels
    conversation: str | None = None  # the conversation this row is a turn of (DataNeeds.conversations)
    turn: int | None = None  # its place in the conversation (None: ordered by id)


def checksums(index: dict) -> dict[str, str]:
    """Shard name -> the sha256 of its Parquet file, for the shards whose prepare recorded one (older prepared
    data has none: its cached copies are checked by size only)."""
    return {s["name"]: s["sha256"] for s in index["shards"] if s.get("sha256")}


def shard_uri(prepared: str, name: str) -> str:
    return storage.checked_join(storage.join(prepared, SHARD_DIR), f"{name}.parquet", INDEX_FILE, single=True)


def marker_uri(prepared: str, name: str) -> str:
    return storage.join(prepared, SHARD_DIR, f"{name}.done")


def stored_array(codes: np.ndarray, codec: object) -> np.ndarray:
    """A codec's output as the shards keep it: int16 codes, or what its ``stored_dtype`` names (int32 for codebooks
    of more than 32,768 codes, float32 features). Codes that int16 cannot hold are refused, never wrapped."""
    dtype = np.dtype(getattr(codec, "stored_dtype", "int16"))
    codes = np.asarray(codes)
    if dtype.kind == "i" and codes.size and (codes.min() < np.iinfo(dtype).min or codes.max() > np.iinfo(dtype).max):
        raise ValueError(f"codec {getattr(codec, 'name', type(codec).__name__)} gave codes in [{codes.min()}, "
                         f"{codes.max()}], which {dtype} cannot hold; the codec must declare a wider stored_dtype")
    return codes.astype(dtype)


def _dtype_of(rows: list[EncodedUtterance]) -> str:
    kinds = {str(a.dtype) for r in rows for a in (r.codes, *r.voice_prompts)}
    if "float32" not in kinds:
        return "int32" if "int32" in kinds else "int16"
    if kinds != {"float32"}:
        raise ValueError(f"a shard's rows mix feature and code arrays ({sorted(kinds)})")
    return "float32"


def encode_table(rows: list[EncodedUtterance]) -> bytes:
    """Rows -> Parquet file bytes."""
    dtype = _dtype_of(rows)
    cols = {
        "id": [r.id for r in rows],
        "text": [r.text for r in rows],
        "speaker": [r.speaker for r in rows],
        "description": [r.description for r in rows],
        "duration": [r.duration for r in rows],
        "num_frames": [int(r.codes.shape[1]) for r in rows],
        "codes": [np.ascontiguousarray(r.codes, dtype=dtype).tobytes() for r in rows],
        "ref_audio": [b"" if r.ref_audio is None else _pcm16(r.ref_audio) for r in rows],
        "voice_prompts": [[np.ascontiguousarray(p, dtype=dtype).tobytes() for p in r.voice_prompts] for r in rows],
        "conversation": [r.conversation for r in rows],
        "turn": [r.turn for r in rows],
    }
    schema = SCHEMA if dtype == "int16" else SCHEMA.with_metadata({DTYPE_KEY: dtype.encode()})
    buf = io.BytesIO()
    pq.write_table(pa.table(cols, schema=schema), buf, compression="zstd")
    return buf.getvalue()


def _pcm16(wav: np.ndarray) -> bytes:
    return (np.clip(wav, -1.0, 1.0) * 32767).astype(np.int16).tobytes()


def decode_table(data: bytes, num_codebooks: int) -> list[EncodedUtterance]:
    """Parquet file bytes -> rows (codes as int16 [K, T], or float32 where the schema says so)."""
    read = pq.read_table(io.BytesIO(data))
    dtype = (read.schema.metadata or {}).get(DTYPE_KEY, b"int16").decode()
    if dtype not in STORED_DTYPES:
        raise PrepareError(f"a shard stores arrays of {dtype!r}, which this voxrelay cannot read; update voxrelay")
    table = read.to_pydict()
    out = []
    for i in range(len(table["id"])):
        codes = np.frombuffer(table["codes"][i], dtype=dtype).reshape(num_codebooks, -1)
        out.append(
            EncodedUtterance(
                id=table["id"][i],
                text=table["text"][i],
                speaker=table["speaker"][i],
                description=table["description"][i],
                duration=float(table["duration"][i]),
                codes=codes,
                ref_audio=_from_pcm16(table["ref_audio"][i]) if table.get("ref_audio") else None,
                voice_prompts=tuple(np.frombuffer(p, dtype=dtype).reshape(num_codebooks, -1)
                                    for p in (table["voice_prompts"][i] or [])) if "voice_prompts" in table else (),
                conversation=table["conversation"][i] if "conversation" in table else None,
                turn=table["turn"][i] if "turn" in table else None,
            )
        )
    return out


def _from_pcm16(data: bytes) -> np.ndarray | None:
    return np.frombuffer(data, dtype=np.int16).astype(np.float32) / 32767 if data else None
