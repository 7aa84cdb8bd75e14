"""Building a layout model's module and tokenizer: from ``model.init_from`` (a checkpoint of the layout's model keeps
its audio tokens; the base LM gets the layout's tokens added and its embeddings grown), at random (training from
scratch, the layout's ``random_init`` sizes unless the config sets them), or on the meta device (planning)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from voxrelay.errors import ConfigError, one_line
from voxrelay.models.causal_lm.layout import Layout
from voxrelay.models.hf import ModelLoadError, auto_config, load_causal_lm, looks_local, missing_folder

# model.weights_dtype; auto is resolved by the run (voxrelay.models.registry.as_trained): alone it is float32
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": torch.float32}


def load_tokenizer(source: str, what: str, layout: Layout) -> Any:
    """The model's tokenizer with the layout's tokens: as saved (a checkpoint of the layout's model), or a base LM's
    (``base_vocab`` ids) with ``add_tokens`` added; every id the layout pins is checked."""
    from transformers import AutoTokenizer

    fix = f"point it at the tokenizer of a {layout.name} checkpoint or of its base LM (tokenizer.json) or a hub id"
    if problem := missing_folder(source, what, fix):
        raise ModelLoadError(problem)
    try:
        tok = AutoTokenizer.from_pretrained(str(Path(source).expanduser()) if looks_local(source) else source)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{what}={source!r} has no loadable tokenizer ({one_line(e)[:300]}); {fix}") from e
    if len(tok) == layout.base_vocab and layout.add_tokens:
        tok.add_tokens(layout.added_names())
    check_tokenizer(tok, source, what, layout)
    if tok.pad_token is None:
        tok.pad_token = layout.pad
    return tok


def add_extra(tok: Any, tokens: list[str]) -> int:
    """Add ``tokens`` (``model.add_tokens``) the tokenizer lacks, after everything it has; returns the first new id
    (the tokenizer's size when none was added). A token that is already one token of the text is kept as it is; one
    that spells a symbol of a byte-level tokenizer's byte alphabet (e.g. ``ł``, ``ó``) cannot be added (the
    tokenizer would map it to that byte's id) and is refused."""
    first = len(tok)
    missing = [t for t in dict.fromkeys(tokens) if not own_token(tok, t)]
    if clashing := [t for t in missing if t in tok.get_vocab()]:
        raise ConfigError(f"model.add_tokens: {clashing[:5]} cannot be added: the tokenizer already names a byte "
                          "with that character (byte-level BPE), so each would read as a byte; leave them out "
                          "(`voxrelay prepare --check-text` lists only what can be added)")
    if missing:
        tok.add_tokens(missing)
    return first


def own_token(tok: Any, text: str) -> bool:
    """Whether ``text`` is tokenized as exactly one token of its own."""
    ids = tok.encode(text, add_special_tokens=False)
    return len(ids) == 1 and tok.decode(ids) == text


def check_tokenizer(tok: Any, source: str, what: str, layout: Layout) -> None:
    """Refuse a tokenizer whose ids are not the layout's (another model's tokenizer would train garbage)."""
    wrong = {name: tok.convert_tokens_to_ids(name) for name, want in layout.ids.items()
             if tok.convert_tokens_to_ids(name) != want}
    if wrong:
        shown = ", ".join(f"{n} is {got} (layout: {layout.ids[n]})" for n, got in list(wrong.items())[:3])
        raise ModelLoadError(
            f"{what}={source!r}: its tokenizer ({len(tok)} ids) does not have layout {layout.name}'s ids: {shown}; "
            f"use a {layout.name} checkpoint's tokenizer or its base LM's ({layout.base_vocab} ids)")


def rows_needed(layout: Layout, tokenizer_size: int) -> int:
    """Embedding rows the model needs: the layout's ``vocab_size``, at least the tokenizer's size."""
    return max(layout.vocab_size or 0, tokenizer_size)


def random_config(cfg: Any, layout: Layout, rows: int, ids: dict[str, int | None]) -> Any:
    """A config of the layout's architecture with ``cfg``'s sizes (each unset one: the layout's ``random_init``)."""
    from transformers import LlamaConfig, Qwen2Config

    init = layout.random_init
    size = lambda key: getattr(cfg, key) if getattr(cfg, key) is not None else getattr(init, key)  # noqa: E731
    kwargs = dict(vocab_size=rows, hidden_size=size("hidden_size"), intermediate_size=size("intermediate_size"),
                  num_hidden_layers=size("num_layers"), num_attention_heads=size("num_heads"),
                  num_key_value_heads=size("num_kv_heads"), max_position_embeddings=max(cfg.max_seq_len or 0,
                                                                                         layout.max_seq_len, 2048),
                  rope_theta=init.rope_theta, tie_word_embeddings=init.tie_word_embeddings,
                  attention_dropout=cfg.dropout, **ids)
    return (LlamaConfig if layout.architecture == "llama" else Qwen2Config)(**kwargs)


def build_module(cfg: Any, layout: Layout, rows: int, ids: dict[str, int | None]) -> Any:
    """The module with weights: ``init_from`` (grown to ``rows`` when it is the base LM) or random. The caller
    seeds (and forks) the RNG."""
    from transformers import AutoModelForCausalLM

    dtype = DTYPES[cfg.weights_dtype]
    if cfg.init_from is None:
        return AutoModelForCausalLM.from_config(random_config(cfg, layout, rows, ids), attn_implementation="sdpa",
                                                dtype=dtype)
    module = load_causal_lm(cfg.init_from, "model.init_from", attn_implementation="sdpa", dtype=dtype,
                            attention_dropout=cfg.dropout)
    have = module.get_input_embeddings().weight.shape[0]
    if have < layout.base_vocab:
        raise ModelLoadError(f"model.init_from={cfg.init_from!r} embeds {have} ids, fewer than the base LM's "
                             f"{layout.base_vocab} of layout {layout.name}: start from a {layout.name} checkpoint or "
                             "its base LM")
    if have < rows:  # the base LM: the layout's ids are new rows (mean-initialised by transformers)
        module.resize_token_embeddings(rows)
    for key, value in ids.items():
        setattr(module.config, key, value)
    return module


def meta_module(cfg: Any, layout: Layout, rows: int, ids: dict[str, int | None]) -> Any:
    """What :func:`build_module` gives, on the meta device: shapes only (only config.json of init_from read)."""
    from transformers import AutoModelForCausalLM

    config = random_config(cfg, layout, rows, ids) if cfg.init_from is None else auto_config(cfg.init_from)
    config.vocab_size = max(config.vocab_size, rows)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=DTYPES[cfg.weights_dtype])


def tokenizer_source(cfg: Any, layout: Layout) -> str:
    source = cfg.tokenizer or cfg.init_from
    if source is None:
        raise ConfigError(f"model.layout={layout.name} needs model.init_from (a {layout.name} checkpoint or its base "
                          "LM) or, for a random init, model.tokenizer (its base LM's tokenizer)")
    return source
