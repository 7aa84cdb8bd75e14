"""The seam between training/inference and a model family.

A family (a :class:`~voxrelay.models.seam.FamilySpec` registered by name in :mod:`voxrelay.models.registry`,
chosen by ``model.family``) builds or loads a :class:`FamilyModel`: the module plus everything that turns
prepared rows into batches, batches into a loss, and text into codes. ``train/``, evaluation,
``inference`` and ``export`` use only what is declared here, so a family with continuous latents
(VibeVoice), an encoder-decoder with a delay pattern (Parler) or a pretrained LM layout (Orpheus)
plugs in without touching the loop.

Shapes: a batch is a dict of tensors whose keys belong to the family, plus one count per loss
term (int64 scalars under :data:`LOSS_COUNT` + the term's name) put there by ``collate``; generated
codes are int64 ``[K, T]``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from voxrelay.errors import UserError

if TYPE_CHECKING:
    import torch

# Prefix of the keys that `collate` adds to a batch, one per loss term: how many targets the term will
# average over, known before the forward pass, so the loop can normalise each term over a whole
# gradient-accumulation window and every process.
LOSS_COUNT = "loss_count/"

Example = dict[str, np.ndarray]  # one training example as the family encodes it (numpy, CPU)
Batch = dict[str, "torch.Tensor"]  # collated examples (+ a LOSS_COUNT key per loss term)


@dataclass(frozen=True)
class DataSpec:
    """What a family learns from the prepared data before it can build a model.

    ``num_codebooks`` K and ``codebook_size`` of the codec, the speakers of the data (sorted names,
    may be empty), the codec's ``frame_rate`` (frames per second) and ``sample_rate`` (Hz), its
    vector of each code (float [K, C, D], for codecs that have them, such as mel_kmeans' centroids), and the
    data's codec description (``index.json``'s ``codec``: e.g. whose encoders made stored features).
    """

    num_codebooks: int
    codebook_size: int
    speakers: list[str] = field(default_factory=list)
    frame_rate: float | None = None
    sample_rate: int | None = None
    code_vectors: Any = field(default=None, repr=False, compare=False)
    codec: dict[str, Any] | None = field(default=None, repr=False, compare=False)  # index.json's, for a family's checks

    @classmethod
    def from_prepared(cls, index: dict, codec: Any) -> DataSpec:
        """From a prepared ``index.json`` and its codec (an :class:`~voxrelay.codecs.base.AudioCodec`)."""
        vectors = codec.code_vectors() if hasattr(codec, "code_vectors") else None
        return cls(int(index["num_codebooks"]), int(codec.codebook_size), list(index.get("speakers") or []),
                   float(codec.frame_rate), int(codec.sample_rate), vectors, dict(index.get("codec") or {}))

    def to_note(self) -> dict[str, Any]:
        """The JSON-able fields (all but ``code_vectors`` and ``codec``), as an adapter-only export records them."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("code_vectors", "codec")}


@runtime_checkable
class Row(Protocol):
    """A prepared utterance as a family sees it (:class:`voxrelay.data.shards.EncodedUtterance`)."""

    text: str
    speaker: str | None
    description: str | None
    codes: np.ndarray  # int [K, T]


def num_frames(row: Row) -> int:
    """Frames of a row's codes: its ``num_frames`` when it has one (a row of the row index carries no codes,
    see :class:`voxrelay.data.rowindex.RowMeta`), else the width of its codes. ``length`` uses this."""
    n = getattr(row, "num_frames", None)
    return int(n) if n is not None else int(np.asarray(row.codes).shape[1])


@dataclass(frozen=True)
class Request:
    """What to speak, for synthesis and evaluation alike: the ``text``; a ``speaker`` of the training data
    (None: the model's default); a ``description`` of the voice and style, for a family that conditions on
    one (Parler); ``voice_prompts``: reference recordings (mono float32 at the model's codec rate, one per
    speaker), for a family that clones voices from them (VibeVoice)."""

    text: str
    speaker: str | None = None
    description: str | None = None
    voice_prompts: tuple[np.ndarray, ...] = field(default=(), repr=False, compare=False)


class Speech(NamedTuple):
    """Generated speech: ``wav`` mono float32 at ``sample_rate``; ``frames`` how many frames the family
    generated (its codec's or latent frames), for length ratios and stop checks against ``max_frames``."""

    wav: np.ndarray
    sample_rate: int
    frames: int


class RequestError(UserError, ValueError):
    """A request asks for something this family cannot use (a description, voice prompts)."""


REQUEST_FIELDS = ("description", "voice_prompts")  # what a family may or may not take (FamilyModel.request_fields)


def check_request(model: Any, request: Request) -> None:
    """Refuse a request that sets a field ``model`` does not use: it would be silently ignored."""
    unused = [name for name in REQUEST_FIELDS if getattr(request, name) and name not in model.request_fields]
    if unused:
        raise RequestError(f"model.family={model.family} takes no {' or '.join(unused)}: leave "
                           f"{'it' if len(unused) == 1 else 'them'} out (e.g. drop --description, or the JSONL field)")


def request_for(model: Any, text: str, speaker: str | None = None, description: str | None = None,
                voice_prompts: tuple[np.ndarray, ...] = ()) -> Request:
    """A request built from data (a held-out row, an eval text): the fields ``model`` does not take are
    left out rather than refused (a dataset may carry descriptions, or a row its voice prompts, that a
    family ignores)."""
    return Request(text, speaker, description if "description" in model.request_fields else None,
                   tuple(voice_prompts) if "voice_prompts" in model.request_fields else ())


SAMPLING_OPTIONS = ("top_p", "repetition_penalty")  # what a family's speak() may take beyond temperature and top_k


def sampling_options(model: Any, **given: float | None) -> dict[str, float]:
    """The sampling options of :data:`SAMPLING_OPTIONS` a caller sets (None: the family's default) as ``speak()``
    keywords; one ``model`` does not take (``FamilyModel.sampling_options``) is refused."""
    chosen = {name: value for name, value in given.items() if value is not None}
    unused = [name for name in chosen if name not in getattr(model, "sampling_options", ())]
    if unused:
        raise RequestError(f"model.family={model.family} samples with temperature and top-k only: leave "
                           f"{' and '.join(unused)} unset (--top-p, --repetition-penalty, eval.top_p, "
                           "eval.repetition_penalty)")
    return chosen


def speak_codes(model: Any, request: Request, codec: Any, max_frames: int | None, temperature: float,
                top_k: int | None, seed: int, **options: float | None) -> Speech:
    """:meth:`FamilyModel.speak` of a family that generates codes of ``codec`` with its ``generate(text,
    speaker=...)``: codes -> waveform by the codec. ``options``: its sampling options (top_p ...)."""
    check_request(model, request)
    codes = model.generate(request.text, speaker=request.speaker, max_frames=max_frames, temperature=temperature,
                           top_k=top_k, seed=seed, **options)
    frames = codes.shape[1]
    wav = codec.decode(codes) if frames else np.zeros(0, dtype=np.float32)
    return Speech(np.asarray(wav, dtype=np.float32), int(codec.sample_rate), frames)


class LossTerm(NamedTuple):
    """One named term of a family's loss. ``sum``: float32 scalar summed over the term's targets (with
    grad); ``count``: int64 scalar, how many targets; ``weight``: its factor in the objective, which is
    ``sum over terms of weight * (sum / count)`` with sums and counts taken over a whole optimizer step
    (every micro-batch, every process). A weight of 0 makes a monitored-only term (logged, no gradient)."""

    sum: torch.Tensor
    count: torch.Tensor
    weight: float = 1.0


LossTerms = dict[str, LossTerm]  # term name -> term, in the order the family logs them


def with_counts(batch: dict[str, torch.Tensor], counts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``batch`` with one :data:`LOSS_COUNT` key per loss term (``counts``: term -> int64 scalar)."""
    return batch | {LOSS_COUNT + name: count for name, count in counts.items()}


def pop_counts(batch: dict[str, torch.Tensor]) -> dict[str, int]:
    """Remove and return the per-term target counts that ``collate`` put into ``batch``."""
    keys = [k for k in batch if k.startswith(LOSS_COUNT)]
    return {k[len(LOSS_COUNT):]: int(batch.pop(k)) for k in keys}


def weighted_mean(sums: dict[str, float], counts: dict[str, int], weights: dict[str, float]) -> float:
    """The objective's value: the weighted sum of each term's mean (a term without targets counts 0)."""
    return sum(weights[name] * (sums[name] / max(counts[name], 1)) for name in sums)


@runtime_checkable
class FamilyModel(Protocol):
    """A built model of some family: what the loop, evaluation, inference and export call."""

    family: str  # the `model.family` name
    module: torch.nn.Module  # the trainable torch module (what accelerate/DDP/FSDP wrap)
    speakers: list[str]  # voices `synthesize --voice` accepts (empty: single speaker)
    max_length: int  # longest example `length` accepts
    max_length_key: str  # the config key that sets max_length (named in warnings and errors)
    request_fields: tuple[str, ...]  # which of REQUEST_FIELDS its speak() uses (others are refused)
    # which of SAMPLING_OPTIONS its speak() takes as keywords, its defaults being upstream's (others are refused;
    # FamilyModelBase: none)
    sampling_options: tuple[str, ...]
    # where the upstream (transformers) model sits inside ``module`` ("" when module is it): an adapter-only
    # export's keys are laid out for that model, so peft applies them to the upstream class (FamilyModelBase: "")
    upstream_prefix: str

    def length(self, row: Row) -> int:
        """Size of the example of ``row`` for the batch plan (tokens incl. special ones); may exceed
        ``max_length`` (the caller leaves such rows out)."""
        ...

    def example(self, row: Row) -> Example:
        """One training example from a prepared row (text, speaker, description, codes)."""
        ...

    def collate(self, examples: list[Example]) -> Batch:
        """Pad ``examples`` into a batch of CPU tensors with the count of every loss term (:func:`with_counts`)."""
        ...

    def loss(self, module: torch.nn.Module, batch: Batch) -> LossTerms:
        """The loss terms of ``batch`` (the same names ``collate`` counted); ``module`` is ``self.module``
        possibly wrapped (DDP, FSDP, precision) and is called through its forward, so the wrappers' hooks
        fire; ``batch`` is on its device."""
        ...

    def speak(self, request: Request, codec: Any, max_frames: int | None = None, temperature: float = 0.8,
              top_k: int | None = 50, seed: int = 0) -> Speech:
        """Speech for ``request``, deterministic for a ``seed``; ``temperature <= 0`` is greedy; at most
        ``max_frames`` frames (None: as long as the model allows). ``codec`` is the prepared data's (a family
        may decode with its own); a request field the family cannot use raises :class:`RequestError`."""
        ...

    def save_pretrained(self, folder: str | os.PathLike[str]) -> None:
        """Write a self-contained folder that the spec's ``load`` reads (``voxrelay.json`` last, naming
        the family); this is also the export format."""
        ...

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """Optimizer parameter groups of the trainable parameters (frozen encoders left out)."""
        ...

    def lora_defaults(self) -> LoraDefaults:
        """What ``train.lora`` uses for the keys a config leaves unset (see :class:`LoraDefaults`)."""
        ...

    def new_token_rows(self) -> list[int]:
        """Ids of the input embeddings (and output head) that the pretrained checkpoint lacked and the build added
        (e.g. audio ids grown onto a plain LM): what ``train.lora.embeddings=new_rows`` trains (FamilyModelBase: the
        range ``new_rows`` the family's build sets, none by default)."""
        ...

    # the hooks below have defaults in voxrelay.models.seam.FamilyModelBase, which every family's model subclasses
    def fsdp_layer_classes(self) -> tuple[type[torch.nn.Module], ...]:
        """The layer classes FSDP shards as units (default: the transformers model's ``_no_split_modules``)."""
        ...

    uses_corpus: bool  # use_corpus() also when a run is loaded for synthesis and evaluation
    chunked_heads: bool  # its loss goes through linear_ce.head_loss (train.chunked_loss)
    loss_kernel: str
    loss_chunk_tokens: int
    frame_rate: float | None  # frames per second of Speech.frames (None: the codec's)
    full_budget_length: int | None  # batches of longer examples hold count x longest² <= batch_tokens x this

    def generators(self) -> dict[str, torch.Generator]: ...
    def extra_state(self) -> dict[str, torch.Tensor]: ...
    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None: ...
    def after_optimizer_step(self) -> None: ...
    def eval_weights(self) -> AbstractContextManager[None]: ...
    def use_corpus(self, rows: Sequence[Row]) -> None: ...
    def voice_references(self, request: Request) -> list | None: ...
    def spoken_text(self, text: str) -> str: ...
    def stored_prompt(self, codec: Any, stored: np.ndarray) -> np.ndarray: ...
    def plan_shape(self, lora_rank: int = 0) -> Any: ...
    def save_as(self, fmt: str, folder: Any, codec: Any) -> None: ...


@dataclass(frozen=True)
class LoraDefaults:
    """A family's LoRA defaults: rank ``r``, ``alpha``, ``dropout``, ``rslora`` (alpha / sqrt(r) scaling),
    ``target_modules`` (module names, or one regex string, that get adapters) and ``modules_to_save``
    (modules trained in full beside the adapters, e.g. ``lm_head`` and ``embed_tokens`` when the vocabulary
    has new audio ids); ``base_bits`` (QLoRA's quantised base: none unless asked)."""

    r: int
    alpha: float
    dropout: float
    rslora: bool
    target_modules: list[str] | str
    modules_to_save: list[str]
    base_bits: int | None = None
    # the input embeddings and output head, trained in full beside modules_to_save when train.lora.embeddings=full
    # (what runs saved before that key did); new_rows trains only the rows of FamilyModel.new_token_rows
    embeddings: list[str] = field(default_factory=list)


def decay_groups(module: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Optimizer groups of ``module``'s trainable parameters: matrices decayed by ``weight_decay``; norms,
    biases and other 1-d parameters not (decaying a norm's gain pulls it towards 0, not towards "simpler").
    Empty groups are left out; frozen parameters are left out."""
    decay, no_decay = [], []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


@dataclass(frozen=True)
class DataNeeds:
    """What a family needs ``prepare`` to produce, as its config section's ``data_needs()`` says (no
    torch needed: ``prepare`` and ``plan`` ask it before any model is built). ``codes``: the (codes per
    frame, codebook size) its vocabulary takes, ``None`` for any codec's; ``codec``: the ``codec.type`` it
    needs (``None``: the configured one); ``fields``: text fields every row must carry (``("description",)``)."""

    codes: tuple[int, int] | None = None
    codec: str | None = None
    fields: tuple[str, ...] = ()
    audio_rate: int | None = None  # the family learns from the audio itself, stored at this rate (codec.type=pcm)
    features: str | None = None  # ... or from its frozen encoders' outputs, precomputed by this codec.type
    # why a row (text, num_speakers, speaker; + its number of voice prompts when ``voice_prompts``) cannot be
    # used, or None: prepare rejects it with that reason
    row_check: Callable[..., str | None] | None = None
    voice_prompts: bool = False  # the family clones voices from prompts: prepare keeps a row's voice_prompts
    conversations: bool = False  # the family takes previous turns as context: prepare keeps conversation and turn
    max_seconds: float | None = None  # longest audio a row may have (prepare rejects longer ones with max_seconds_why)
    max_seconds_why: str = ""  # the limit's reason and fix, e.g. "model.max_length=4096 allows at most 540 s"
    # what the family advises about the prepared data (its index.json), e.g. another way to store it at this size
    advice: Callable[[dict[str, Any]], str | None] | None = None

    def refusal(self, family: str, codec: dict[str, Any], where: str = "codec") -> str | None:
        """Why data whose codec is described by ``codec`` (``describe()``, as in index.json) cannot feed this
        family, with the fix; None when it can. ``where``: how to name the codec settings in the message."""
        kind = codec.get("type")
        if self.features is not None and kind == self.features:
            return None
        if self.audio_rate is not None:
            if kind == "pcm" and int(codec.get("sample_rate", 0)) == self.audio_rate:
                return None
            also = (f", or codec.type={self.features} with codec.path=<the model you train> (its encoders' outputs, "
                    "computed once)") if self.features else ""
            return (f"model.family={family} learns from the audio itself at {self.audio_rate} Hz, but the {where} is "
                    f"{kind} at {codec.get('sample_rate')} Hz; set codec.type=pcm and codec.sample_rate="
                    f"{self.audio_rate}{also} (under another data.name)")
        if kind == "pcm" or int(codec.get("codebook_size", 1)) == 0:  # audio, or a model's features: no codes
            what = "plain audio (codec.type=pcm)" if kind == "pcm" else f"features, not codes (codec.type={kind})"
            return (f"model.family={family} learns discrete codes, but the {where} stores {what}; set codec.type to "
                    "a codec with codes (mel_kmeans, snac, dac), under another data.name")
        return None


def module_classes(module: torch.nn.Module, names: Sequence[str]) -> tuple[type[torch.nn.Module], ...]:
    """The classes of ``module``'s submodules whose class name is in ``names`` (e.g. a transformers
    model's ``_no_split_modules``), in order of first appearance."""
    found: dict[str, type] = {}
    for sub in module.modules():
        name = type(sub).__name__
        if name in names and name not in found:
            found[name] = type(sub)
    return tuple(found.values())
