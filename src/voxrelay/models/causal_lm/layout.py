"""A declared token layout: how one upstream TTS model lays text and codec codes out for its causal LM.

A layout is a small YAML file (the built-in ones are ``layouts/<name>.yaml`` beside this module; a user's is any
path) read into :class:`Layout`. It says, without code:

- which codec the model speaks (``codec``: its ``codec.type`` / ``codec.path``, ``codebooks`` x ``codebook_size``)
  and how the codes of one frame become token ids: audio token ``n`` is named ``audio_token.format(n)``; position
  ``k`` (0..K-1) of a frame holds the grid row ``frame_order[k]`` and code ``c`` is token
  ``audio_token_start + k * codebook_size + c`` (``shared_ids``: ``audio_token_start + c`` at every position);
- which tokens the layout adds to its base LM's tokenizer (``add_tokens``, when the tokenizer has ``base_vocab``
  ids) and the ids upstream has for some of them (``ids``: checked against every tokenizer the run loads);
- the prompt before the audio: a literal ``prompt`` with ``{text}``, or a ``chat`` rendered by the tokenizer's own
  chat template (``continue_final_message``, with ``chat_kwargs``), the ``{text}`` part tokenized on its own
  (upstream's tokens when the text sits between special tokens, as in every built-in layout);
- the tokens after the audio (``after_audio``), the one that ends generation (``stop``), the pad, what the loss
  covers, and upstream's sampling and LoRA defaults.

Torch-free: the config reads a layout to know what ``prepare`` must produce.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from voxrelay.errors import ConfigError

BUILT_IN = Path(__file__).parent / "layouts"


class TokenRange(BaseModel):
    """``count`` tokens named ``template.format(n)`` for n = ``first`` .. ``first + count - 1``."""

    model_config = ConfigDict(extra="forbid")
    template: str
    count: int = Field(gt=0)
    first: int = 0

    def names(self) -> list[str]:
        return [self.template.format(n) for n in range(self.first, self.first + self.count)]


class ChatTurn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str
    content: str


class Sampling(BaseModel):
    """Upstream's sampling defaults for the options synthesis leaves unset (None: not used); temperature and top-k
    are synthesis' own options (``--temperature``, ``eval.top_k``)."""

    model_config = ConfigDict(extra="forbid")
    top_p: float | None = None
    repetition_penalty: float | None = None


class LoraHint(BaseModel):
    """Upstream's LoRA defaults for this model."""

    model_config = ConfigDict(extra="forbid")
    r: int = 16
    alpha: float = 32
    dropout: float = 0.0
    rslora: bool = False
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class RandomInit(BaseModel):
    """The sizes of a random init (training from scratch), the base LM's by default."""

    model_config = ConfigDict(extra="forbid")
    hidden_size: int = Field(2048, gt=0)
    num_layers: int = Field(16, gt=0)
    num_heads: int = Field(32, gt=0)
    num_kv_heads: int = Field(8, gt=0)
    intermediate_size: int = Field(8192, gt=0)
    rope_theta: float = Field(500000.0, gt=0)
    tie_word_embeddings: bool = True


class Phonemize(BaseModel):
    """The text as eSpeak phonemes, through the ``phonemizer`` package's ``EspeakBackend`` (NeuTTS)."""

    model_config = ConfigDict(extra="forbid")
    language: str = "en-us"
    preserve_punctuation: bool = True
    with_stress: bool = True


class CodecHint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str
    path: str | None = None


class Layout(BaseModel):
    """One model's token layout (see the module docstring); every field is in the YAML file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    summary: str
    upstream: str = Field("", description="where the ids and sequence were checked (code and revision)")
    architecture: Literal["llama", "qwen2"] = "llama"
    random_init: RandomInit = RandomInit()
    codec: CodecHint
    codebooks: int = Field(gt=0)
    codebook_size: int = Field(gt=1)
    frame_order: list[int] | None = None
    audio_token: str
    audio_token_start: int = 0
    shared_ids: bool = False
    base_vocab: int = Field(gt=0)
    add_tokens: list[str | TokenRange] = []
    vocab_size: int | None = None
    ids: dict[str, int] = {}
    prompt: str | None = None
    chat: list[ChatTurn] | None = None
    chat_kwargs: dict[str, str] = {}
    phonemize: Phonemize | None = None
    speaker_format: str | None = "{speaker}: {text}"
    after_audio: list[str] = []
    stop: str
    pad: str
    bos: str | None = None
    loss_on: Literal["all", "speech"] = "all"
    labelled_prompt_tail: int = Field(0, ge=0)
    drop_repeated_frames: bool = False
    max_seq_len: int = Field(2048, gt=0)
    sampling: Sampling = Sampling()
    lora: LoraHint = LoraHint()

    @model_validator(mode="after")
    def _consistent(self) -> Layout:
        if (self.prompt is None) == (self.chat is None):
            raise ValueError("give exactly one of prompt (a literal template) and chat (turns the tokenizer's chat "
                             "template renders)")
        template = self.prompt if self.prompt is not None else "".join(t.content for t in self.chat or [])
        if template.count("{text}") != 1:
            raise ValueError(f"the prompt must hold {{text}} exactly once, not {template.count('{text}')} times")
        if self.frame_order is not None and sorted(self.frame_order) != list(range(self.codebooks)):
            raise ValueError(f"frame_order must order the rows 0..{self.codebooks - 1}, got {self.frame_order}")
        if self.stop not in self.after_audio:
            raise ValueError(f"stop ({self.stop!r}) must be one of after_audio ({self.after_audio})")
        if self.speaker_format is not None and (self.speaker_format.count("{text}") != 1
                                                or self.speaker_format.count("{speaker}") != 1):
            raise ValueError(f"speaker_format must hold {{speaker}} and {{text}} once each, got "
                             f"{self.speaker_format!r}")
        if self.audio_token.count("{}") != 1:
            raise ValueError(f"audio_token must hold {{}} once (where the token's number goes), got "
                             f"{self.audio_token!r}")
        return self

    # ------------------------------------------------------------ derived

    @property
    def rows(self) -> list[int]:
        """The codec grid row at each position of a frame."""
        return list(self.frame_order) if self.frame_order is not None else list(range(self.codebooks))

    @property
    def audio_ids(self) -> int:
        """How many audio token ids the layout uses."""
        return self.codebook_size * (1 if self.shared_ids else self.codebooks)

    def added_names(self) -> list[str]:
        """Every token the layout adds to a base tokenizer, in order."""
        return [n for item in self.add_tokens for n in ([item] if isinstance(item, str) else item.names())]



def built_in_names() -> list[str]:
    return sorted(p.stem for p in BUILT_IN.glob("*.yaml"))


def layout_source(spec: str) -> Path:
    """The file of ``model.layout``: a built-in name or a YAML path."""
    if spec in built_in_names():
        return BUILT_IN / f"{spec}.yaml"
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(f"model.layout={spec!r} is neither a built-in layout ({', '.join(built_in_names())}) nor a "
                          f"YAML file (looked for {path.absolute()}); name one, or write one (docs/layouts.md)")
    return path


@functools.lru_cache(maxsize=32)
def _read(path: str, mtime: float) -> Layout:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"layout file {path}: cannot be read as YAML ({err})") from err
    return from_dict(data, f"layout file {path}")


def from_dict(data: Any, where: str) -> Layout:
    """A layout from its YAML/JSON mapping; a bad one is a :class:`ConfigError` naming the field."""
    try:
        return Layout.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
                             for e in err.errors()[:4])
        more = f" (and {len(err.errors()) - 4} more)" if len(err.errors()) > 4 else ""
        raise ConfigError(f"{where}: {problems}{more} (docs/layouts.md lists every field)") from err


def load_layout(spec: str) -> Layout:
    """``model.layout`` (a built-in name or a YAML path) as a :class:`Layout`."""
    path = layout_source(spec)
    return _read(str(path), path.stat().st_mtime)
