"""F5-TTS's text, as upstream f5-tts 1.1.22 reads it: a vocabulary file (``vocab.txt``: one token per line, the
line's index its id, " " at 0, unknown tokens read as 0) or UTF-8 bytes, and the tokens of a text: its characters,
with upstream's word segmentation (rjieba) putting a space between runs of letters that touch, and Chinese characters
as " " + tone-numbered pinyin (pypinyin, ``TONE3`` with tone sandhi), after upstream's few punctuation swaps. Equal
to upstream's ``convert_char_to_pinyin`` + ``list_str_to_idx`` (``tests/unit/models/test_f5_dit.py``).

rjieba and pypinyin come with ``voxrelay[f5]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from voxrelay.errors import UserError

SWAPS = str.maketrans({";": ",", "\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})


class TextError(UserError, ValueError):
    """A vocabulary that cannot be read, or text that needs a package not installed; names the fix."""


def is_chinese(c: str) -> bool:
    return "\u3100" <= c <= "\u9fff"


def _pinyin(text: str) -> list[str]:
    from pypinyin import Style, lazy_pinyin

    return lazy_pinyin(text, style=Style.TONE3, tone_sandhi=True)


def tokens(text: str) -> list[str]:
    """The tokens of ``text``: characters, with a " " between letter runs upstream's segmentation separates, and each
    Chinese character as " " + its pinyin syllable."""
    try:
        import rjieba
    except ImportError:
        raise TextError("model.family=f5 segments text as upstream does with rjieba (and pypinyin for Chinese): "
                        "pip install 'voxrelay[f5]'") from None
    out: list[str] = []
    for seg in rjieba.cut(text.translate(SWAPS)):
        size = len(seg.encode("utf-8"))
        if size == len(seg):  # letters, digits and symbols only
            if out and size > 1 and out[-1] not in " :'\"":
                out.append(" ")
            out.extend(seg)
        elif size == 3 * len(seg):  # East Asian characters only
            for c, syllable in zip(seg, _pinyin(seg), strict=True):
                out += [" ", syllable] if is_chinese(c) else [syllable]
        else:  # mixed
            for c in seg:
                if ord(c) < 256:
                    out.append(c)
                elif is_chinese(c):
                    out += [" ", *_pinyin(c)]
                else:
                    out.append(c)
    return out


@dataclass(frozen=True)
class Vocab:
    """Token -> id (``ids`` None: UTF-8 bytes, 256 ids)."""

    ids: dict[str, int] | None

    @classmethod
    def read(cls, path: str | Path) -> Vocab:
        """A ``vocab.txt`` as upstream reads it (each line but its newline is a token; the file ends with one)."""
        try:
            lines = Path(path).read_text(encoding="utf-8").split("\n")
        except (OSError, UnicodeDecodeError) as e:
            raise TextError(f"model.vocab={str(path)!r} cannot be read ({e}); point it at the checkpoint's vocab.txt "
                            "(F5TTS_v1_Base: its pinyin vocab, 2545 tokens)") from None
        vocab = {token: i for i, token in enumerate(lines[:-1] if lines[-1] == "" else lines)}
        if vocab.get(" ") != 0:
            raise TextError(f"model.vocab={str(path)!r}: its first line must be a single space (id 0, what unknown "
                            "tokens read as), as upstream's vocab files have it")
        return cls(vocab)

    @classmethod
    def utf8(cls) -> Vocab:
        return cls(None)

    def __len__(self) -> int:
        return 256 if self.ids is None else len(self.ids)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` (an unknown token: 0)."""
        if self.ids is None:
            return list(text.encode("utf-8"))
        return [self.ids.get(t, 0) for t in tokens(text)]

    def unknown(self, text: str) -> list[str]:
        """The tokens of ``text`` this vocabulary lacks (they read as a space)."""
        return [] if self.ids is None else [t for t in tokens(text) if t not in self.ids]


def batch_ids(rows: list[list[int]]) -> torch.Tensor:
    """int64 [B, max len], padded with -1."""
    out = torch.full((len(rows), max((len(r) for r in rows), default=0)), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out
