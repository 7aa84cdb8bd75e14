"""Token id layout of the codec LM: text ids, then 4 special ids, then one id range per codebook.

    [0, text_vocab)                                  text tokens (bytes or a HF tokenizer)
    text_vocab + 0 .. 3                              PAD, BOS, AUDIO_START, AUDIO_END
    audio_offset + k * codebook_size + c             code c of codebook k (k in [0, K), c in [0, C))

A sequence is ``[BOS, text..., AUDIO_START, frame 0 codes k=0..K-1, frame 1 codes..., AUDIO_END]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

NUM_SPECIALS = 4


@dataclass(frozen=True)
class VocabLayout:
    """Where text, special and audio ids live in the LM vocabulary."""

    text_vocab: int
    num_codebooks: int
    codebook_size: int

    def __post_init__(self) -> None:
        for name in ("text_vocab", "num_codebooks", "codebook_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"VocabLayout.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def pad_id(self) -> int:
        return self.text_vocab

    @property
    def bos_id(self) -> int:
        return self.text_vocab + 1

    @property
    def audio_start_id(self) -> int:
        return self.text_vocab + 2

    @property
    def audio_end_id(self) -> int:
        return self.text_vocab + 3

    @property
    def audio_offset(self) -> int:
        return self.text_vocab + NUM_SPECIALS

    @property
    def vocab_size(self) -> int:
        """Total number of ids the LM embeds and predicts."""
        return self.audio_offset + self.num_codebooks * self.codebook_size

    def codebook_range(self, k: int) -> tuple[int, int]:
        """Ids ``[lo, hi)`` of codebook ``k``."""
        if not 0 <= k < self.num_codebooks:
            raise ValueError(f"codebook {k} does not exist; the layout has {self.num_codebooks} codebooks")
        lo = self.audio_offset + k * self.codebook_size
        return lo, lo + self.codebook_size

    def check_codes(self, codes: np.ndarray, num_codebooks: int | None = None) -> np.ndarray:
        """``codes`` as an array, checked to be int [K, T] in ``[0, codebook_size)``; K = ``num_codebooks``
        (default: the layout's; a layout with several frames per position has K * G id ranges)."""
        codes, k = np.asarray(codes), num_codebooks or self.num_codebooks
        if codes.ndim != 2 or codes.shape[0] != k:
            raise ValueError(
                f"codes must have shape [K={k}, T], got {list(codes.shape)}; "
                "was the data prepared with a different codec?"
            )
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError(
                f"codes must be in [0, {self.codebook_size}), got range [{codes.min()}, {codes.max()}]; "
                "was the data prepared with a different codec?"
            )
        return codes

    def codes_to_ids(self, codes: np.ndarray) -> np.ndarray:
        """codes int [K, T] -> ids int64 [K*T], frame by frame (k = 0..K-1 of frame 0, then frame 1...)."""
        codes = self.check_codes(codes)
        offsets = self.audio_offset + np.arange(self.num_codebooks, dtype=np.int64)[:, None] * self.codebook_size
        return (codes.astype(np.int64) + offsets).T.reshape(-1)

    def ids_to_codes(self, ids: np.ndarray) -> np.ndarray:
        """ids int [K*T] (audio ids only, frame by frame) -> codes int64 [K, T]."""
        ids = np.asarray(ids, dtype=np.int64)
        k = self.num_codebooks
        if ids.ndim != 1 or ids.size % k:
            raise ValueError(f"expected a 1-D run of whole frames ({k} ids each), got shape {list(ids.shape)}")
        frames = ids.reshape(-1, k).T  # [K, T]
        codes = frames - self.audio_offset - np.arange(k, dtype=np.int64)[:, None] * self.codebook_size
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError("ids are not audio ids of the codebook due at their position (frame by frame)")
        return codes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VocabLayout:
        return cls(int(data["text_vocab"]), int(data["num_codebooks"]), int(data["codebook_size"]))
