"""Orpheus-TTS' token layout, exactly as upstream (canopyai/Orpheus-TTS and its Unsloth notebook).

The Llama-3 tokenizer has 128,256 ids; Orpheus adds ``<custom_token_0>`` .. ``<custom_token_28682>`` at
ids 128,256 + N (vocabulary 156,940 with one spare row). Special ids and the audio ids of one SNAC frame::

    start_of_human 128259   end_of_human 128260   start_of_ai 128261   end_of_ai 128262
    start_of_speech 128257  end_of_speech 128258  pad 128263           BOS 128000, end_of_text 128009
    audio id at position k (0..6) of a frame = 128266 + k * 4096 + code

The 7 codes of coarse frame i, in upstream order: ``c0[i], c1[2i], c2[4i], c2[4i+1], c1[2i+1], c2[4i+2],
c2[4i+3]``. voxrelay's SNAC codec stores codes as a grid [7, T] with rows ``c0, c1 sub 0, c1 sub 1,
c2 sub 0..3`` (see :mod:`voxrelay.codecs.snac`), so position k of a frame is grid row ``FRAME_ROWS[k]``.

numpy only (no torch), so the layout can be tested and used anywhere.
"""

from __future__ import annotations

import numpy as np

LLAMA3_VOCAB = 128_256
NUM_CUSTOM_TOKENS = 7 * 4096 + 10 + 1  # 28,683
TOKENIZER_SIZE = LLAMA3_VOCAB + NUM_CUSTOM_TOKENS  # 156,939
VOCAB_SIZE = 156_940  # Orpheus' config.json: one row more than the tokenizer

BOS = 128_000
END_OF_TEXT = 128_009
START_OF_SPEECH = 128_257
END_OF_SPEECH = 128_258
START_OF_HUMAN = 128_259
END_OF_HUMAN = 128_260
START_OF_AI = 128_261
END_OF_AI = 128_262
PAD = 128_263
AUDIO_START = 128_266

CODES_PER_FRAME = 7
CODEBOOK_SIZE = 4096
FRAME_ROWS = np.array([0, 1, 3, 4, 2, 5, 6])  # grid row of position k = 0..6 of a frame
OFFSETS = AUDIO_START + CODEBOOK_SIZE * np.arange(CODES_PER_FRAME)  # first id of each position
AUDIO_END_ID = AUDIO_START + CODES_PER_FRAME * CODEBOOK_SIZE  # one past the last audio id (156,938)


def custom_token(token_id: int) -> str:
    """The tokenizer's name of an id Orpheus added (e.g. 128259 -> ``<custom_token_3>``)."""
    return f"<custom_token_{token_id - LLAMA3_VOCAB}>"


def prompt_ids(text_ids: list[int]) -> list[int]:
    """The prompt before the speech: ``[start_of_human, BOS, text, end_of_text, end_of_human, start_of_ai,
    start_of_speech]`` for the tokenizer's ids of the text (no special tokens in ``text_ids``)."""
    return [START_OF_HUMAN, BOS, *text_ids, END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH]


def codes_to_ids(codes: np.ndarray) -> np.ndarray:
    """SNAC grid int [7, T] -> audio ids int64 [7 * T], frame by frame in upstream order."""
    codes = np.asarray(codes, dtype=np.int64)
    if codes.ndim != 2 or codes.shape[0] != CODES_PER_FRAME:
        raise ValueError(f"Orpheus needs SNAC codes [7, T] (3 codebooks at rates 1:2:4), got shape {codes.shape}")
    if codes.size and (codes.min() < 0 or codes.max() >= CODEBOOK_SIZE):
        raise ValueError(f"SNAC codes must be in [0, {CODEBOOK_SIZE}), got [{codes.min()}, {codes.max()}]")
    return (codes[FRAME_ROWS].T + OFFSETS).reshape(-1)  # [T, 7] frame-major, position k offset by k * 4096


def drop_duplicate_frames(codes: np.ndarray) -> np.ndarray:
    """SNAC grid [7, T] without the frames whose first code (c0) equals the previous kept frame's, as upstream's
    data preparation (the Unsloth notebook's ``remove_duplicate_frames``). A dropped frame's c0 equals the kept
    one before it, so "the previous kept frame's c0" is the previous frame's: a run of equal c0 keeps its first."""
    codes = np.asarray(codes)
    if codes.shape[-1] < 2:
        return codes
    keep = np.concatenate([[True], codes[0, 1:] != codes[0, :-1]])
    return codes[:, keep]


def ids_to_codes(ids: np.ndarray | list[int]) -> np.ndarray:
    """Generated ids -> SNAC grid int64 [7, T], as upstream decodes: crop after the last start_of_speech, drop
    end_of_speech (and anything that is not an audio id), keep whole frames, subtract each position's offset,
    and drop frames with a code out of its position's range (upstream rejects them). T may be 0."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    starts = np.flatnonzero(ids == START_OF_SPEECH)
    if starts.size:
        ids = ids[starts[-1] + 1 :]
    ids = ids[(ids >= AUDIO_START) & (ids < AUDIO_END_ID)]
    frames = ids[: ids.size // CODES_PER_FRAME * CODES_PER_FRAME].reshape(-1, CODES_PER_FRAME) - OFFSETS
    frames = frames[((frames >= 0) & (frames < CODEBOOK_SIZE)).all(axis=1)]
    grid = np.empty((CODES_PER_FRAME, frames.shape[0]), dtype=np.int64)
    grid[FRAME_ROWS] = frames.T
    return grid
