"""Building an Orpheus module and tokenizer: from ``model.init_from`` (an Orpheus checkpoint keeps its audio
tokens; a plain Llama-3 one gets Orpheus' 28,683 tokens added and its embeddings grown to 156,940 rows),
at random (training from scratch), or on the meta device (planning)."""

from __future__ import annotations

from typing import Any

import torch

from voxrelay.config import ConfigError
from voxrelay.errors import one_line
from voxrelay.models.hf import ModelLoadError, auto_config, load_causal_lm, looks_local, missing_folder
from voxrelay.models.orpheus import layout as L
from voxrelay.models.orpheus.config import OrpheusConfig

# model.weights_dtype; auto is resolved by the run (voxrelay.models.registry.as_trained): alone it is float32
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": torch.float32}


def load_tokenizer(source: str, what: str) -> Any:
    """A Llama-3 or Orpheus tokenizer with Orpheus' custom tokens at their upstream ids (added when missing)."""
    from pathlib import Path

    from transformers import AutoTokenizer

    fix = "point it at a Llama-3 or Orpheus tokenizer folder (tokenizer.json) or hub id"
    if problem := missing_folder(source, what, fix):
        raise ModelLoadError(problem)
    try:
        tok = AutoTokenizer.from_pretrained(str(Path(source).expanduser()) if looks_local(source) else source)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{what}={source!r} has no loadable tokenizer ({one_line(e)[:300]}); point it at a "
                             "Llama-3 or Orpheus tokenizer folder (tokenizer.json) or hub id") from e
    if len(tok) == L.LLAMA3_VOCAB:
        tok.add_tokens([f"<custom_token_{i}>" for i in range(L.NUM_CUSTOM_TOKENS)])
    check_tokenizer(tok, source, what)
    if tok.pad_token is None:
        tok.pad_token = L.custom_token(L.PAD)
    return tok


def check_tokenizer(tok: Any, source: str, what: str) -> None:
    """Refuse a tokenizer whose ids are not Orpheus' (another base model's tokenizer would train garbage)."""
    expect = {"<custom_token_0>": L.LLAMA3_VOCAB, L.custom_token(L.START_OF_HUMAN): L.START_OF_HUMAN,
              L.custom_token(L.AUDIO_START): L.AUDIO_START}
    got = {name: tok.convert_tokens_to_ids(name) for name in expect}
    if len(tok) != L.TOKENIZER_SIZE or got != expect or tok.bos_token_id != L.BOS \
            or tok.convert_tokens_to_ids("<|eot_id|>") != L.END_OF_TEXT:
        raise ModelLoadError(
            f"{what}={source!r}: its tokenizer ({len(tok)} ids, BOS {tok.bos_token_id}) is neither Llama-3's "
            f"({L.LLAMA3_VOCAB} ids, BOS {L.BOS}, <|eot_id|> {L.END_OF_TEXT}) nor Orpheus' ({L.TOKENIZER_SIZE}); "
            "set model.tokenizer to a Llama-3 tokenizer (e.g. meta-llama/Llama-3.2-3B)"
        )


def tokenizer_source(cfg: OrpheusConfig) -> str:
    source = cfg.tokenizer or cfg.init_from
    if source is None:
        raise ConfigError("model.family=orpheus needs model.init_from (e.g. canopylabs/orpheus-3b-0.1-pretrained) "
                          "or, for a random init, model.tokenizer (a Llama-3 tokenizer, e.g. meta-llama/Llama-3.2-3B)")
    return source


def random_config(cfg: OrpheusConfig) -> Any:
    """A Llama-3-style config of ``cfg``'s sizes with Orpheus' vocabulary (tied embeddings, as Llama-3.2-3B)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=L.VOCAB_SIZE, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=max(cfg.max_seq_len, 2048), rope_theta=cfg.rope_theta, tie_word_embeddings=True,
        attention_dropout=cfg.dropout, bos_token_id=L.BOS, eos_token_id=L.END_OF_SPEECH, pad_token_id=L.PAD,
    )


def build_module(cfg: OrpheusConfig) -> Any:
    """The module for ``cfg`` with weights: ``init_from`` (grown to Orpheus' vocabulary when it is a plain
    Llama-3) or random. The caller seeds (and forks) the RNG."""
    from transformers import LlamaForCausalLM

    dtype = DTYPES[cfg.weights_dtype]
    if cfg.init_from is None:
        return LlamaForCausalLM._from_config(random_config(cfg), attn_implementation="sdpa", dtype=dtype)
    module = load_causal_lm(cfg.init_from, "model.init_from", attn_implementation="sdpa", dtype=dtype,
                            attention_dropout=cfg.dropout)
    rows = module.get_input_embeddings().weight.shape[0]
    if rows < L.LLAMA3_VOCAB:
        raise ModelLoadError(f"model.init_from={cfg.init_from!r} embeds {rows} ids, fewer than Llama-3's "
                             f"{L.LLAMA3_VOCAB}: Orpheus starts from a Llama-3 model (e.g. meta-llama/Llama-3.2-3B)")
    if rows < L.TOKENIZER_SIZE:  # a plain Llama-3: Orpheus' ids are new rows (mean-initialised by transformers)
        module.resize_token_embeddings(L.VOCAB_SIZE)
    _set_ids(module.config)
    return module


def meta_module(cfg: OrpheusConfig) -> Any:
    """What :func:`build_module` gives, on the meta device: shapes only (only config.json of init_from read)."""
    from transformers import AutoModelForCausalLM

    config = random_config(cfg) if cfg.init_from is None else auto_config(cfg.init_from)
    config.vocab_size = max(config.vocab_size, L.VOCAB_SIZE)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=DTYPES[cfg.weights_dtype])


def _set_ids(config: Any) -> None:
    config.pad_token_id = L.PAD
    config.bos_token_id = L.BOS
    config.eos_token_id = L.END_OF_SPEECH
