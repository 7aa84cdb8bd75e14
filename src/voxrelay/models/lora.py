"""LoRA (peft) on a family's model: :func:`apply_lora` wraps ``model.module`` in a ``PeftModel`` with the
family's defaults (:meth:`FamilyModel.lora_defaults`) for every ``train.lora`` key left unset; the base
stays frozen. Training applies it as one of its strategies (:mod:`voxrelay.train.strategies`); planning
(:mod:`voxrelay.plan`) applies it on the meta device to count what trains. peft is imported lazily.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from voxrelay.config import ConfigError
from voxrelay.errors import one_line
from voxrelay.models.qlora import quantise_base, require_bitsandbytes

if TYPE_CHECKING:
    import torch

    from voxrelay.models.base import FamilyModel
    from voxrelay.models.lora_config import LoraConfig

log = logging.getLogger(__name__)


class LoraSettingsError(ConfigError):
    """``train.lora`` does not fit the model (e.g. target_modules that match none of its modules)."""


def lora_settings(model: FamilyModel, cfg: LoraConfig) -> dict:
    """``cfg``'s keys, those left unset (None) taken from the family's :class:`LoraDefaults`."""
    defaults = model.lora_defaults()
    chosen = {key: getattr(cfg, key) for key in type(cfg).model_fields}
    settings = {key: getattr(defaults, key) if value is None else value for key, value in chosen.items()}
    if cfg.modules_to_save is None and cfg.embeddings == "full":
        settings["modules_to_save"] = [*defaults.modules_to_save, *defaults.embeddings]
    return settings


def token_rows(model: FamilyModel, settings: dict) -> dict[str, list[int]] | None:
    """peft's ``trainable_token_indices`` under ``embeddings=new_rows``: the family's new token rows of the input
    embeddings, and of the output head when it is not tied to them (peft follows a tied head by itself); None when
    no token was added or the embeddings train in full (modules_to_save)."""
    rows = getattr(model, "new_token_rows", list)() if settings["embeddings"] == "new_rows" else []
    emb = model.module.get_input_embeddings() if hasattr(model.module, "get_input_embeddings") else None
    if not rows or emb is None:
        return None
    names = {id(m): name.rsplit(".", 1)[-1] for name, m in model.module.named_modules()}
    out = {names[id(emb)]: rows}
    head = model.module.get_output_embeddings()
    if head is not None and not ties_embeddings(model.module):
        out[names[id(head)]] = rows
    if set(out) & set(settings["modules_to_save"] or []):
        return None  # trained in full already
    return out


def ties_embeddings(module: torch.nn.Module) -> bool:
    """True when the module's output projection shares its weight with the input embeddings (Orpheus'
    Llama): peft must then tie the trained copies too, or the two drift apart and train twice."""
    get_in, get_out = getattr(module, "get_input_embeddings", None), getattr(module, "get_output_embeddings", None)
    if get_in is None or get_out is None:
        return False
    emb, head = get_in(), get_out()
    return emb is not None and head is not None and getattr(emb, "weight", None) is getattr(head, "weight", 0)


def apply_lora(model: FamilyModel, cfg: LoraConfig | None, compute_dtype: torch.dtype | None = None,
               training: bool = True) -> None:
    """Replace ``model.module`` by a ``PeftModel`` with LoRA adapters (no-op when ``cfg`` is None), its frozen
    base quantised when ``cfg.base_bits`` is set (:mod:`voxrelay.models.qlora`; computing in ``compute_dtype``,
    None: each weight's own dtype; not on the meta device, where ``plan`` prices the quantised layout instead).

    The family's loss and generate call the module as before (PeftModel forwards every argument).
    Adapter initialisation draws from the global torch RNG, which the caller has seeded. ``training``: the log
    line says what trains (False: a checkpoint loaded to synthesize, evaluate or export says what the adapters hold).
    """
    if cfg is None:
        return
    import peft

    s = lora_settings(model, cfg)
    quantise = bool(s["base_bits"]) and next(model.module.parameters()).device.type != "meta"
    if quantise:
        require_bitsandbytes(s["base_bits"])  # before peft's work: the error, not a half-built model
    tied = ties_embeddings(model.module)
    rows = token_rows(model, s)
    config = peft.LoraConfig(
        r=s["r"], lora_alpha=s["alpha"], lora_dropout=s["dropout"], use_rslora=s["rslora"],
        target_modules=s["target_modules"], modules_to_save=list(s["modules_to_save"]) or None,
        ensure_weight_tying=tied and bool(s["modules_to_save"] or rows), trainable_token_indices=rows,
    )
    try:
        with quiet_peft():
            model.module = peft.get_peft_model(model.module, config)
    except ValueError as e:  # peft's message for target_modules or modules_to_save that match nothing
        raise LoraSettingsError(
            f"train.lora does not fit this {model.family} model ({one_line(e)[:300]}); "
            f"set train.lora.target_modules / modules_to_save to names of its modules, e.g. "
            f"{_linear_names(model.module)} (null = the family's default)"
        ) from None
    train_in_float32(model.module)
    if quantise:
        quantise_base(model, s["base_bits"], compute_dtype)
    trainable = sum(p.numel() for p in model.module.parameters() if p.requires_grad)
    total = sum(_numel(p) for p in model.module.parameters())
    base_dtype = next((p.dtype for p in model.module.parameters() if not p.requires_grad), None)
    log.info("LoRA r=%d alpha=%g dropout=%g rslora=%s on %s; trained in full: %s; token rows trained: %s; tied "
             "embeddings: %s; frozen base in %s; %s %s of %s parameters (%.2f%%)", s["r"], s["alpha"],
             s["dropout"], s["rslora"], s["target_modules"], s["modules_to_save"] or "none",
             {k: len(v) for k, v in rows.items()} if rows else "none", tied, base_dtype,
             "training" if training else "adapters and trained modules:", f"{trainable:,}",
             f"{total:,}", 100 * trainable / max(total, 1))


def train_in_float32(module: torch.nn.Module) -> None:
    """What trains (adapters, modules_to_save copies, new token rows) in float32 over a base held in bf16/fp16:
    the optimizer's updates, ~1e-3 of a weight, would round away in 8 bits of mantissa. A tied pair stays one
    tensor (its ``data`` is replaced in place)."""
    import torch

    for p in module.parameters():
        if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.float()


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """peft 0.21 reads a transformers 5 property deprecated in favour of another: a FutureWarning on every
    wrap that the user can do nothing about."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


ADAPTER_CONFIG = "adapter_config.json"  # peft's file names
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_ROOT = "base_model.model."  # peft's prefix of every saved key


def save_adapter(module: torch.nn.Module, folder: Path, prefix: str = "") -> None:
    """peft's adapter files of ``module`` (a ``PeftModel``) in ``folder``, laid out for the transformers model at
    ``prefix`` inside the wrapped module (e.g. ``net.``: a family's training wrapper around it): keys without the
    prefix, and an ``adapter_config.json`` naming that model's class and checkpoint, so that
    ``PeftModel.from_pretrained(<class>.from_pretrained(base), folder)`` and ``AutoPeftModel`` apply it."""
    from safetensors.torch import load_file, save_file

    module.save_pretrained(str(folder))
    if not prefix:
        return
    inner = module.get_base_model().get_submodule(prefix.rstrip("."))
    weights = folder / ADAPTER_WEIGHTS
    state = load_file(str(weights))
    outside = [k for k in state if not k.startswith(_PEFT_ROOT + prefix)]
    assert not outside, f"trained weights outside the {type(inner).__name__} at {prefix!r}: {outside[:3]}"
    save_file({_PEFT_ROOT + k[len(_PEFT_ROOT + prefix):]: v for k, v in state.items()}, str(weights),
              metadata={"format": "pt"})
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    config["auto_mapping"] = {"base_model_class": type(inner).__name__, "parent_library": type(inner).__module__}
    config["base_model_name_or_path"] = getattr(inner, "name_or_path", None) or None
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))


def adapter_key_mapping(prefix: str) -> dict[str, str] | None:
    """peft's ``key_mapping`` that puts the keys of an adapter saved by :func:`save_adapter` (no ``prefix``) back
    under ``prefix``; keys already there (adapter files written before, of the wrapper itself) stay."""
    return {rf"^(?!{re.escape(prefix)})": prefix} if prefix else None


def module_keys(saved: set[str], prefix: str) -> set[str]:
    """The keys of an adapter file as the wrapped module names them (see :func:`adapter_key_mapping`)."""
    if not prefix:
        return set(saved)
    return {k if k.startswith(_PEFT_ROOT + prefix) else _PEFT_ROOT + prefix + k.removeprefix(_PEFT_ROOT) for k in saved}


def _linear_names(module: torch.nn.Module) -> list[str]:
    import torch

    return sorted({name.rsplit(".", 1)[-1] for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)})


def _numel(p: torch.nn.Parameter) -> int:
    """Weights a parameter stands for: an NF4 one (bitsandbytes' Params4bit) holds them packed two per byte."""
    state = getattr(p, "quant_state", None)
    return int(state.shape.numel()) if state is not None and getattr(state, "shape", None) is not None else p.numel()
