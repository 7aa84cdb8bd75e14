"""Text tokenizers of the codec LM: UTF-8 bytes (no download), eSpeak NG phonemes (``phonemes``
or ``phonemes:<language>``: the UTF-8 bytes of the IPA transcription) or any HF tokenizer.

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

from voxrelay.errors import UserError, one_line
from voxrelay.models.hf import looks_local

BYTES_SPEC = "bytes"
PHONEMES_SPEC = "phonemes"
_MARKER = "voxrelay_tokenizer.json"
# What a folder written by a HF tokenizer's save_pretrained always holds (at least one of).
_HF_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


class TokenizerError(UserError, ValueError):
    """``model.tokenizer`` (or a saved tokenizer folder) cannot be loaded; the message says why and the fix."""


class TokenizerNotFoundError(TokenizerError, FileNotFoundError):
    """A tokenizer folder that does not exist or was not written completely."""


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


class PhonemeTokenizer(ByteTokenizer):
    """The UTF-8 bytes of eSpeak NG's IPA transcription (``data.phonemize``): pronunciation spelled
    out, so the model need not learn English spelling. ``decode`` gives the IPA back."""

    def __init__(self, language: str = "en-us") -> None:
        self.language = language
        self.spec = PHONEMES_SPEC if language == "en-us" else f"{PHONEMES_SPEC}:{language}"

    def encode(self, text: str) -> list[int]:
        from voxrelay.data.phonemize import phonemize

        return list(phonemize(text, self.language).encode("utf-8"))

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / _MARKER).write_text(json.dumps({"type": PHONEMES_SPEC, "language": self.language}))


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
    if spec == PHONEMES_SPEC or spec.startswith(PHONEMES_SPEC + ":"):
        return _phoneme_tokenizer(spec.partition(":")[2] or "en-us")
    folder = Path(spec).expanduser()
    fix = "set model.tokenizer to 'bytes', a local folder holding tokenizer files, or a HF hub id"
    if not folder.is_dir() and looks_local(spec):
        raise TokenizerNotFoundError(f"model.tokenizer={spec!r}: no such folder (and not a hub id); {fix}")
    if folder.is_dir() and not any((folder / name).is_file() for name in _HF_TOKENIZER_FILES):
        raise TokenizerNotFoundError(
            f"model.tokenizer={spec!r}: the folder holds no tokenizer files ({' or '.join(_HF_TOKENIZER_FILES)}, "
            f"as written by a tokenizer's save_pretrained); {fix}"
        )
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(str(folder) if folder.is_dir() else spec)
    except (OSError, ValueError, ImportError) as e:
        where = "local folder" if folder.is_dir() else "hub id (it is not a local folder)"
        raise TokenizerError(
            f"cannot load model.tokenizer={spec!r} as a {where} ({one_line(e)}); {fix} reachable from this machine"
        ) from e
    return HFTextTokenizer(hf, spec)


def load_saved_tokenizer(folder: str | Path) -> TextTokenizer:
    """Load a tokenizer written by ``tok.save(folder)`` (no network access needed)."""
    folder = Path(folder)
    marker = folder / _MARKER
    if not marker.is_file():
        raise TokenizerNotFoundError(
            f"{marker} is missing: {folder} was not written (completely) by TextTokenizer.save; "
            "save the model again or point at a complete voxrelay model folder"
        )
    meta = json.loads(marker.read_text())
    if meta["type"] == BYTES_SPEC:
        return ByteTokenizer()
    if meta["type"] == PHONEMES_SPEC:
        return _phoneme_tokenizer(meta["language"])
    from transformers import AutoTokenizer

    return HFTextTokenizer(AutoTokenizer.from_pretrained(str(folder)), meta["spec"])


def _phoneme_tokenizer(language: str) -> PhonemeTokenizer:
    """A phoneme tokenizer whose language eSpeak NG knows (checked now, not at the first batch)."""
    from voxrelay.data.demo_corpus import SynthesisError
    from voxrelay.data.phonemize import phonemize

    try:
        phonemize("a", language)
    except SynthesisError as e:
        why = "no such language" if "has no voice" in str(e) else str(e)
        raise TokenizerError(f"model.tokenizer=phonemes:{language}: eSpeak NG cannot phonemize it ({why}); "
                             "`voxrelay demo --list-voices` lists the languages, e.g. phonemes:en-gb") from None
    return PhonemeTokenizer(language)
