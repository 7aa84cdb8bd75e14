"""Orpheus-TTS' token layout, exactly as upstream (canopyai/Orpheus-TTS and its Unsloth notebook).

The Llama-3 tokenizer has 128,256 ids; Orpheus adds ``<custom_token_0>`` .. ``<custom_token_28682>`` at
ids 128,256 + N (vocabulary 156,940 with one spare row). Special ids and the audio ids of one SNAC frame::

    start_of_human 128259   end_of_human 128260   start_of_ai 128261   end_of_ai 128262
    start_of_speech 128257  end_of_speech 128258  pad 128263           BOS 128000, end_of_text 128009
    audio id at position k (0..6) of a frame = 128266 + k * 4096 + code

The 7 codes of coarse frame i, in upstream order: ``c0[i], c1[2i], c2[4i], c2[4i+1], c1[2i+1], c2[4i+2],
c2[4i+3]``. voxrelay's SNAC codec stores codes as a grid [7, T] with rows ``c0, c1 sub 0, c1 sub 1,
c2 sub 0..3`` (see :mod:`voxrelay.codecs.snac`), so position k of a frame is grid row ``FRAME_ROWS[k]``.

The sequence logic is the causal_lm family's (``models/causal_lm/layouts/orpheus.yaml`` resolved as a
:class:`~voxrelay.models.causal_lm.tokens.TokenMap`); the constants here are upstream's, written out, and a test
holds the layout file, resolved against a Llama-3 tokenizer, to them. numpy only (no torch).
"""

from __future__ import annotations

import functools

import numpy as np

from voxrelay.models.causal_lm.layout import load_layout
from voxrelay.models.causal_lm.tokens import TokenMap, drop_repeated_frames

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


@functools.cache
def token_map() -> TokenMap:
    """The orpheus layout's ids, as upstream has them (no tokenizer needed)."""
    return TokenMap(load_layout("orpheus"), before_text=(START_OF_HUMAN, BOS),
                    after_text=(END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH),
                    after_audio=(END_OF_SPEECH, END_OF_AI), stop=END_OF_SPEECH, pad=PAD, bos=BOS,
                    audio_start=AUDIO_START)


def prompt_ids(text_ids: list[int]) -> list[int]:
    """The prompt before the speech: ``[start_of_human, BOS, text, end_of_text, end_of_human, start_of_ai,
    start_of_speech]`` for the tokenizer's ids of the text (no special tokens in ``text_ids``)."""
    return token_map().prompt_ids(text_ids)


def codes_to_ids(codes: np.ndarray) -> np.ndarray:
    """SNAC grid int [7, T] -> audio ids int64 [7 * T], frame by frame in upstream order."""
    return token_map().codes_to_ids(codes)


def ids_to_codes(ids: np.ndarray | list[int]) -> np.ndarray:
    """Generated ids -> SNAC grid int64 [7, T], as upstream decodes: crop after the last start_of_speech, drop
    end_of_speech (and anything that is not an audio id), keep whole frames, subtract each position's offset,
    and drop frames with a code out of its position's range (upstream rejects them). T may be 0."""
    return token_map().ids_to_codes(ids)


drop_duplicate_frames = drop_repeated_frames  # upstream's remove_duplicate_frames
