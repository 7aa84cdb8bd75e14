"""Voice prompts a row names (a ``voice_prompts`` column): one reference clip per speaker of its transcript,
in the order of its speaker labels (``[SPEAKER_A]``/``Speaker 0`` first), for a family that clones voices
from prompts (``DataNeeds.voice_prompts``); other families' ``prepare`` ignores the column.

Forms of the column: in ``metadata.csv`` paths separated by ``;`` (``prompts/alice.wav;prompts/bob.wav``);
in JSONL and HF datasets a path or a list of paths (the ``voice_prompts`` key community fine-tuning datasets
use), or audio objects (``{"path"}``, ``{"bytes"}``, ``{"array", "sampling_rate"}``).
Paths follow the same rules as the row's audio path. ``prepare`` decodes each clip, resamples it to the
codec's rate and stores its codes beside the row's (``EncodedUtterance.voice_prompts``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from voxrelay.data.audio import AUDIO_BYTES_KEY, load_utterance_audio
from voxrelay.data.shards import stored_array
from voxrelay.data.types import RowError, Utterance

CSV_SEPARATOR = ";"
# a path (str) -> (resolved path, None) or (None, why it cannot be used)
Resolve = Callable[[str], tuple[str | None, str | None]]


def prompt_refs(value: object, resolve: Resolve, row: Utterance, column: str) -> list[Utterance]:
    """The clips a ``voice_prompts`` cell names, as audio-only utterances; a bad entry sets ``row.problem``.
    ``value``: a ``;``-separated string, a list, or one audio object; None or empty: no prompts."""
    if value is None or value == "" or value == []:
        return []
    if isinstance(value, str):
        items: list = [v.strip() for v in value.split(CSV_SEPARATOR) if v.strip()]
    else:
        items = list(value) if isinstance(value, list | tuple) else [value]
    refs = []
    for i, item in enumerate(items):
        ref = Utterance(id=f"{row.id} voice prompt {i}", text="", where=row.where)
        raw = item.get("path") if isinstance(item, dict) else item
        if isinstance(item, dict) and item.get("bytes"):
            ref.extra[AUDIO_BYTES_KEY] = item["bytes"]
        elif isinstance(item, dict) and item.get("array") is not None:
            ref.audio = np.asarray(item["array"], dtype=np.float32)
            ref.sample_rate = item.get("sampling_rate") or item.get("sample_rate")
        elif isinstance(raw, str) and raw.strip():
            ref.audio_path, reason = resolve(raw.strip())
            if reason:
                row.problem = row.problem or f"{column} entry {i}: {reason}"
        else:
            row.problem = row.problem or (f"{column} entry {i} is {item!r}: give a path (a list of paths, one per "
                                          "speaker in the order of their labels)")
        refs.append(ref)
    return refs


def encode_prompts(utt: Utterance, codec, max_duration: float, cache: dict) -> tuple[np.ndarray, ...]:
    """The codes of each of ``utt``'s voice prompts (int16 [K, T], or a codec's float32 features); ``cache``: path
    -> codes, shared by the rows of a shard (many rows name the same few clips). Raises :class:`RowError` naming
    the prompt."""
    out = []
    for i, ref in enumerate(utt.voice_prompts):
        if ref.audio_path is not None and ref.audio_path in cache:
            out.append(cache[ref.audio_path])
            continue
        try:
            wav = load_utterance_audio(ref, codec.sample_rate, 0.0, max_duration)
        except RowError as err:
            raise RowError(f"voice prompt {i}{f' {ref.audio_path}' if ref.audio_path else ''}: {err}") from None
        codes = stored_array(codec.encode(wav), codec)
        if ref.audio_path is not None:
            cache[ref.audio_path] = codes
        out.append(codes)
    return tuple(out)
