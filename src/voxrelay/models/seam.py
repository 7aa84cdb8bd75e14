"""Everything a family declares, each with its default: what training, planning, inference and export may
ask of a family, and nothing else (a test refuses a ``hasattr``/``getattr`` probe of these names outside
``models/``).

A family is one folder ``models/<family>/`` and one :class:`FamilySpec` in
:data:`voxrelay.models.registry.FAMILIES`:

- :class:`FamilySpec` (torch-free, like torchtitan's ``TrainSpec``): the name, the ``model:`` section's class,
  where its build and load functions live, its export formats and the methods FSDP must route through the root;
- :class:`FamilyConfig`: the base of that ``model:`` section, with the hooks ``prepare``, ``plan`` and the config
  ask before any model exists (what the data must hold, what the host caches, a training setting it refuses);
- :class:`FamilyModelBase`: the base of a built model, with the hooks of a built model that most families leave
  at their defaults (state beside the weights, frame rate, voice references, the plan's layer shape).

Importing this module imports no torch (``--help`` and ``config show`` read the registry).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from voxrelay.models.base import DataNeeds, Request, Row

if TYPE_CHECKING:
    import numpy as np
    import torch

    from voxrelay.plan.formulas import Shape


class FamilyConfig(BaseModel):
    """The base of a family's ``model:`` section. A family's section sets ``family`` to a ``Literal`` of its
    name and adds its keys; the hooks below are asked before any model is built (no torch)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    family: str
    # model.* keys added since runs were saved, with the value that keeps the behaviour such a run had (a resumed
    # run compares against it), and keys whose default changed since, with the old default
    ADDED_WITH_NEW_BEHAVIOUR: ClassVar[dict[str, object]] = {}
    CHANGED_DEFAULTS: ClassVar[dict[str, object]] = {}

    def pretrained(self) -> str | None:
        """The pretrained weights the model starts from (``model.init_from``), None for a random init."""
        return getattr(self, "init_from", None)

    def data_needs(self) -> DataNeeds:
        """What ``prepare`` must produce for this family (any codec's codes by default)."""
        return DataNeeds()

    def train_refusal(self, lora: bool) -> str | None:
        """Why this section cannot train as configured (``lora``: ``train.lora`` is set), with the fix; None
        when it can. The config refuses such a run before anything is prepared."""
        return None

    def host_cache_bytes(self) -> int:
        """Host memory the family keeps per process beyond the data loader's (e.g. encoded features), for
        ``voxrelay plan``'s host column."""
        return 0

    def text_coverage_fix(self, tokens: list[str]) -> str:
        """The setting that gives ``tokens`` (from :meth:`text_coverage`) tokens of their own, as ``--check-text``
        prints it."""
        import json

        return f"(trained alone under LoRA) 'model.add_tokens={json.dumps(tokens, ensure_ascii=False)}'"

    def text_coverage(self, texts: list[str]) -> list[tuple[str, int, str]] | None:
        """How the model's text vocabulary covers ``texts`` (``voxrelay prepare --check-text``): each character it
        does not know or splits into several tokens, with its count in the texts and how it is tokenized, most
        frequent first; None: the family reads text as bytes or phonemes (every character covered)."""
        return None


@dataclass(frozen=True)
class FamilySpec:
    """One model family, declared once: ``name`` (``model.family``), its ``config`` section class, ``build`` and
    ``load`` as ``"module:function"`` (imported only when used), and its torch-free facts."""

    name: str
    config: type[FamilyConfig]
    # (cfg, data: DataSpec, seed: int, meta: bool = False) -> FamilyModel: random init seeded by ``seed``, or
    # ``cfg.init_from``'s weights; ``meta`` builds shapes only (planning); the global RNG is left untouched
    build: str
    load: str  # (folder) -> FamilyModel: a folder its save_pretrained wrote (no network access)
    summary: str  # one line: what the family is (the registry's listing, errors)
    # `voxrelay export --format X`: upstream layouts FamilyModelBase.save_as writes beside voxrelay's own
    export_formats: tuple[str, ...] = ()
    # methods other than forward that synthesis calls on the root module; FSDP must route them through it
    fsdp_forward_methods: tuple[str, ...] = ()
    # `voxrelay import KIND FILE`: KIND -> "module:function" turning an upstream file into (YAML text, notes)
    importers: Mapping[str, str] = field(default_factory=dict)
    # the family's own codec.type values -> "module:Class": an AudioCodec built by Class.load(codec.path) for
    # prepare and by Class.from_description(index.json's codec) for a prepared dataset (e.g. a model's encoders)
    codecs: Mapping[str, str] = field(default_factory=dict)

    def builder(self) -> Callable[..., Any]:
        return _resolve(self.build)

    def loader(self) -> Callable[..., Any]:
        return _resolve(self.load)


def _resolve(ref: str) -> Callable[..., Any]:
    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr)


class FamilyModelBase:
    """The defaults of every hook a built model may override (see :class:`voxrelay.models.base.FamilyModel` for
    the ones it must implement).

    State beside the weights:

    - :meth:`generators`: its own ``torch.Generator`` s, by name (e.g. diffusion noise and timesteps).
      The trainer seeds each per process from ``train.seed``, the process rank and the name, and saves and
      restores their states per rank with the RNG state, so a resumed run draws the same numbers.
    - :meth:`extra_state` / :meth:`load_extra_state`: tensors saved in every checkpoint beside the
      optimizer state (e.g. an EMA of some weights).
    - :meth:`after_optimizer_step`: called after each applied optimizer step (not after a skipped one).
    - :meth:`eval_weights`: a context in which the module holds the weights evaluation, synthesis and export
      use (e.g. an EMA swapped in); the training weights are back when it ends.
    - :meth:`use_corpus`: the training rows, given once before any example is made, for a family whose example
      of a row draws on other rows (VibeVoice's voice prompts: another clip of the same voice); a family that
      sets ``uses_corpus`` also gets them when a run is loaded for synthesis and evaluation.

    Packed batches (``train.packing``): ``packing_refusal``, :meth:`collate_packed`, :meth:`enable_packing`.

    Synthesis and evaluation: ``frame_rate`` (frames of ``Speech.frames`` per second, None: the codec's),
    :meth:`voice_references`, :meth:`spoken_text`. Planning: :meth:`plan_shape`. Export: :meth:`save_as`.
    """

    uses_corpus = False
    sampling_options: tuple[str, ...] = ()
    upstream_prefix = ""
    # the output head's loss (voxrelay.models.linear_ce): the trainer sets the kernel from train.chunked_loss
    # (voxrelay.models.linear_ce.choose_loss); a family whose loss calls head_loss says so with chunked_heads
    # (voxrelay plan then prices a chunk of logits, not all of them)
    chunked_heads = False
    loss_kernel = "materialised"
    loss_chunk_tokens = 256
    new_rows: tuple[int, int] = (0, 0)  # [start, end) of the ids the build added to a pretrained vocabulary
    # frames per second of what speak() counts in Speech.frames and limits by max_frames (a family generating its
    # own latents sets it); None: the prepared data's codec's frames
    frame_rate: float | None = None
    # train.packing: why this family's batches cannot be packed (None: collate_packed lays a batch's examples end
    # to end in one row, voxrelay.models.packing); `auto` then leaves packing off, `true` is refused with this
    packing_refusal: str | None = "its batches are not declared packable (FamilyModelBase.collate_packed)"

    def collate_packed(self, examples: list) -> dict[str, torch.Tensor]:
        """A batch of ``examples`` packed in one row (see :mod:`voxrelay.models.packing`): the same loss terms and
        counts as :meth:`collate`'s padded batch of them."""
        raise NotImplementedError(f"model.family={self.family} cannot pack batches: {self.packing_refusal}")

    # flash-attention may keep packed examples apart: positions never restart inside an unpacked example
    flash_positions = True
    # a family whose memory grows with the square of its longest example: a padded batch of examples longer than
    # this (in length()'s units) holds fewer, count x longest² <= train.batch_tokens x this; None: no such cap
    full_budget_length: int | None = None

    def enable_packing(self, device_type: str, half_precision: bool = False) -> str:
        """Prepare the module for packed batches (the attention that keeps examples apart); returns its name.
        ``half_precision``: the run computes in bf16/fp16 (with ``flash_positions``, flash-attention's condition)."""
        from voxrelay.models import packing

        return packing.enable(self.module, device_type,  # type: ignore[attr-defined]
                              half_precision and self.flash_positions)

    def new_token_rows(self) -> list[int]:
        return list(range(*self.new_rows))

    def generators(self) -> dict[str, torch.Generator]:
        return {}

    def extra_state(self) -> dict[str, torch.Tensor]:
        return {}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        if state:
            raise ValueError(f"this model keeps no extra state, but the checkpoint holds {sorted(state)[:3]}")

    def after_optimizer_step(self) -> None:
        return None

    def eval_weights(self) -> AbstractContextManager[None]:
        return nullcontext()

    def use_corpus(self, rows: Sequence[Row]) -> None:
        return None

    def voice_references(self, request: Request) -> list | None:
        """The recordings whose voices a sample of ``request`` should have (mono float32, one per speaker), for
        speaker similarity; None: the request's speaker's clips in the data."""
        return None

    def spoken_text(self, text: str) -> str:
        """What a listener hears of ``text`` (a dialogue's words without its speaker tags), for WER."""
        return text

    def stored_prompt(self, codec: Any, stored: np.ndarray) -> np.ndarray:
        """A prepared row's voice prompt (its stored array) as :meth:`speak` takes it in ``Request.voice_prompts``:
        the codec's decoding (a family may keep stored features as they are)."""
        return codec.decode(stored)

    def fsdp_layer_classes(self) -> tuple[type[torch.nn.Module], ...]:
        """The decoder layer class of whichever transformers model the module is (transformers lists it in
        ``_no_split_modules``: the blocks that must stay whole)."""
        from voxrelay.models.base import module_classes

        module = self.module  # type: ignore[attr-defined]
        return module_classes(module, getattr(module, "_no_split_modules", None) or [])

    def plan_shape(self, lora_rank: int = 0) -> Shape:
        """The sizes ``voxrelay plan`` prices a layer by: the module's (HF Llama-style) config by default."""
        return module_shape(self.module, lora_rank)  # type: ignore[attr-defined]

    def save_as(self, fmt: str, folder: Any, codec: Any) -> None:
        """Write ``folder`` in the upstream layout ``fmt`` (one of its spec's ``export_formats``; ``voxrelay
        export --format``): a family with such formats overrides this."""
        raise ValueError(f"unknown export format {fmt!r}; model.family={self.family} writes only voxrelay's own")


def module_shape(module: Any, lora_rank: int = 0) -> Shape:
    """The sizes of a transformers decoder ``module`` (a peft model's base) from its config."""
    base = module.get_base_model() if hasattr(module, "get_base_model") else module
    if getattr(base, "config", None) is None:
        raise NotImplementedError(
            f"the module ({type(base).__name__}) has no transformers config to read the layer sizes from; its "
            "family must override plan_shape (see docs/adding-a-family.md)")
    return decoder_shape(base.config, module, lora_rank)


def decoder_shape(config: Any, module: Any, lora_rank: int = 0, **overrides: Any) -> Shape:
    """A decoder's sizes from its HF ``config`` (``hidden_size``, ``num_attention_heads``, optional ``head_dim`` and
    ``num_key_value_heads`` ...; ``overrides`` replace any of :class:`Shape`'s fields, e.g. a GELU MLP's
    ``intermediate``), with ``lora_rank`` x the adapted Linears per layer counted in ``module``."""
    from voxrelay.plan.formulas import Shape

    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    adapted = sum(1 for name, _ in module.named_modules() if name.endswith("lora_A"))
    per_layer = -(-adapted // config.num_hidden_layers) if adapted else 0
    sizes = {"hidden": config.hidden_size, "intermediate": getattr(config, "intermediate_size", 0),
             "heads": config.num_attention_heads, "kv_dim": kv_heads * head_dim, "head_dim": head_dim,
             "layers": config.num_hidden_layers, "vocab": config.vocab_size, "lora_targets": lora_rank * per_layer}
    return Shape(**(sizes | overrides))
