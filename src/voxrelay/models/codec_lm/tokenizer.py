"""Text tokenizers of the codec LM: UTF-8 bytes (no download) or any HF tokenizer.

Both expose the same tiny interface the model needs::

    ids = tok.encode("Hello")   # -> list[int], each in [0, tok.vocab_size)
    text = tok.decode(ids)      # -> str
    tok.spec                    # how the tokenizer was named in the config ("bytes", a hub id or a path)
    tok.save(folder)            # write what load_saved_tokenizer(folder, spec) needs

No special tokens are added by ``encode``: the codec LM adds its own BOS / AUDIO_START / AUDIO_END
ids after the text vocabulary (see ``vocab.VocabLayout``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

BYTES_SPEC = "bytes"
_MARKER = "voxrelay_tokenizer.json"


@runtime_checkable
class TextTokenizer(Protocol):
    spec: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def save(self, folder: str | Path) -> None: ...


class ByteTokenizer:
    """UTF-8 bytes as ids: 256 ids, works for every language, needs no files."""

    spec = BYTES_SPEC

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        bad = [i for i in ids if not 0 <= int(i) < 256]
        if bad:
            raise ValueError(f"byte ids must be in [0, 256), got {bad[:5]}; pass only text ids to decode")
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / _MARKER).write_text(json.dumps({"type": BYTES_SPEC}))


class HFTextTokenizer:
    """A HF ``transformers`` tokenizer behind the tiny interface (no special tokens added)."""

    def __init__(self, hf_tokenizer: Any, spec: str) -> None:
        self.hf_tokenizer = hf_tokenizer
        self.spec = spec

    @property
    def vocab_size(self) -> int:
        # len() counts added tokens too, unlike hf_tokenizer.vocab_size.
        return len(self.hf_tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.hf_tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.hf_tokenizer.decode([int(i) for i in ids])

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        self.hf_tokenizer.save_pretrained(str(folder))
        (folder / _MARKER).write_text(json.dumps({"type": "hf", "spec": self.spec}))


def load_text_tokenizer(spec: str) -> TextTokenizer:
    """``"bytes"`` -> :class:`ByteTokenizer`; anything else is a HF tokenizer name or local folder."""
    if spec == BYTES_SPEC:
        return ByteTokenizer()
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"cannot load the text tokenizer {spec!r} ({e}); set model.tokenizer to 'bytes', "
            "a local folder holding tokenizer files, or a HF hub id reachable from this machine"
        ) from e
    return HFTextTokenizer(hf, spec)


def load_saved_tokenizer(folder: str | Path) -> TextTokenizer:
    """Load a tokenizer written by ``tok.save(folder)`` (no network access needed)."""
    folder = Path(folder)
    marker = folder / _MARKER
    if not marker.is_file():
        raise FileNotFoundError(f"{marker} is missing; the folder was not written by TextTokenizer.save")
    meta = json.loads(marker.read_text())
    if meta["type"] == BYTES_SPEC:
        return ByteTokenizer()
    from transformers import AutoTokenizer

    return HFTextTokenizer(AutoTokenizer.from_pretrained(str(folder)), meta["spec"])
