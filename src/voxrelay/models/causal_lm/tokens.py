"""A :class:`~voxrelay.models.causal_lm.layout.Layout` resolved against a tokenizer: the ids of the prompt around
the text, of the tokens after the audio, and of every codebook's audio tokens; codes <-> ids both ways.

numpy only (no torch): tested and used anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from voxrelay.errors import UserError
from voxrelay.models.causal_lm.layout import Layout

TEXT = "{text}"


class LayoutPromptError(UserError, ValueError):
    """A text (or voice) that cannot be turned into this layout's prompt."""


@dataclass(frozen=True)
class TokenMap:
    """The ids a layout's sequences are made of (see :func:`resolve`)."""

    layout: Layout
    before_text: tuple[int, ...]  # the prompt's ids before the text
    after_text: tuple[int, ...]  # ... and after it, up to where the audio starts
    after_audio: tuple[int, ...]
    stop: int
    pad: int
    bos: int | None
    audio_start: int  # id of code 0 at position 0

    @property
    def offsets(self) -> np.ndarray:
        """First id of each position of a frame."""
        step = 0 if self.layout.shared_ids else self.layout.codebook_size
        return self.audio_start + step * np.arange(self.layout.codebooks)

    @property
    def audio_end(self) -> int:
        """One past the last audio id."""
        return self.audio_start + self.layout.audio_ids

    def prompt_ids(self, text_ids: list[int]) -> list[int]:
        return [*self.before_text, *text_ids, *self.after_text]

    def codes_to_ids(self, codes: np.ndarray) -> np.ndarray:
        """Codec grid int [K, T] -> audio ids int64 [K * T], frame by frame in the layout's order."""
        lay = self.layout
        codes = np.asarray(codes, dtype=np.int64)
        if codes.ndim != 2 or codes.shape[0] != lay.codebooks:
            raise ValueError(f"layout {lay.name} needs codes [{lay.codebooks}, T], got shape {codes.shape}")
        if codes.size and (codes.min() < 0 or codes.max() >= lay.codebook_size):
            raise ValueError(f"codes must be in [0, {lay.codebook_size}), got [{codes.min()}, {codes.max()}]")
        return (codes[lay.rows].T + self.offsets).reshape(-1)

    def ids_to_codes(self, ids: np.ndarray | list[int]) -> np.ndarray:
        """Generated ids -> codec grid int64 [K, T]: what follows the last prompt end, audio ids only, whole frames,
        each position's offset removed, frames with a code out of its position's range dropped (as Orpheus'
        upstream decoding does). T may be 0."""
        lay = self.layout
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self.after_text:
            starts = np.flatnonzero(ids == self.after_text[-1])
            if starts.size:
                ids = ids[starts[-1] + 1:]
        ids = ids[(ids >= self.audio_start) & (ids < self.audio_end)]
        k = lay.codebooks
        frames = ids[: ids.size // k * k].reshape(-1, k) - self.offsets
        frames = frames[((frames >= 0) & (frames < lay.codebook_size)).all(axis=1)]
        grid = np.empty((k, frames.shape[0]), dtype=np.int64)
        grid[lay.rows] = frames.T
        return grid


def drop_repeated_frames(codes: np.ndarray) -> np.ndarray:
    """Codec grid [K, T] without the frames whose first code equals the previous frame's (Orpheus' upstream data
    preparation, ``remove_duplicate_frames``: a run of equal first codes keeps its first frame)."""
    codes = np.asarray(codes)
    if codes.shape[-1] < 2:
        return codes
    keep = np.concatenate([[True], codes[0, 1:] != codes[0, :-1]])
    return codes[:, keep]


def prompt_template(layout: Layout, tokenizer: Any) -> str:
    """The prompt as one string holding ``{text}``: the literal ``prompt``, or the ``chat`` turns rendered by the
    tokenizer's chat template with the last (assistant) turn left open."""
    if layout.prompt is not None:
        return layout.prompt
    if not getattr(tokenizer, "chat_template", None):
        raise LayoutPromptError(f"layout {layout.name} lays its prompt out in a chat template, but the tokenizer has "
                                "none; use the model's own tokenizer (model.tokenizer or init_from)")
    turns = [t.model_dump() for t in layout.chat or []]
    return tokenizer.apply_chat_template(turns, tokenize=False, continue_final_message=True, **layout.chat_kwargs)


def token_id(tokenizer: Any, name: str, layout: Layout) -> int:
    """The id of token ``name``, which must be one token of the tokenizer."""
    found = tokenizer.convert_tokens_to_ids(name)
    if found is None or found == tokenizer.unk_token_id or tokenizer.convert_ids_to_tokens(found) != name:
        where = "it is among the layout's add_tokens, so the tokenizer is not the layout's base (base_vocab) nor a " \
            "checkpoint of it" if name in layout.added_names() else "add it to the layout's add_tokens, or use the " \
            "model's own tokenizer"
        raise LayoutPromptError(f"layout {layout.name} names the token {name!r}, which the tokenizer does not have; "
                                f"{where}")
    return int(found)


def resolve(layout: Layout, tokenizer: Any) -> TokenMap:
    """``layout``'s ids in ``tokenizer`` (already extended by the layout's tokens)."""
    template = prompt_template(layout, tokenizer)
    before, after = template.split(TEXT)
    encode = lambda s: tuple(tokenizer.encode(s, add_special_tokens=False)) if s else ()  # noqa: E731
    first = token_id(tokenizer, layout.audio_token.format(layout.audio_token_start), layout)
    last_n = layout.audio_token_start + layout.audio_ids - 1
    if token_id(tokenizer, layout.audio_token.format(last_n), layout) != first + layout.audio_ids - 1:
        raise LayoutPromptError(f"layout {layout.name}: the tokenizer's audio tokens {layout.audio_token!r} are not "
                                f"{layout.audio_ids} consecutive ids from {first}; use the model's own tokenizer")
    return TokenMap(layout, encode(before), encode(after),
                    tuple(token_id(tokenizer, n, layout) for n in layout.after_audio),
                    token_id(tokenizer, layout.stop, layout), token_id(tokenizer, layout.pad, layout),
                    token_id(tokenizer, layout.bos, layout) if layout.bos else None, first)
