"""Building a ``csm`` model: transformers' ``CsmForConditionalGeneration`` from ``model.init_from`` (a folder or hub
id in transformers' layout, or a voxrelay export) or random with the config's sizes over the prepared data's Mimi
(whose weights become the model's ``codec_model``, as csm-1b holds Mimi's), its Llama-3 tokenizer; the codec
frozen (never trained, never checkpointed: rebuilt from its source); on the meta device for ``plan``."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch

from voxrelay.errors import ConfigError, one_line
from voxrelay.models.base import DataSpec
from voxrelay.models.hf import (
    FIX,
    ModelLoadError,
    ModelNotFoundError,
    auto_config,
    from_pretrained_whole,
    missing_folder,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": torch.float32}
SPECIALS = 3  # a codebook's ids beyond its codes in CSM's audio vocabulary (csm-1b: 2048 codes, vocab 2051)


def _source(spec: str, what: str) -> str:
    if problem := missing_folder(spec, what, FIX):
        raise ModelNotFoundError(problem)
    folder = Path(spec).expanduser()
    if folder.is_dir() and not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"{what}={spec!r}: the folder has no config.json; {FIX}")
    return str(folder) if folder.is_dir() else spec


def load_csm(spec: str, what: str, dtype: str = "float32", dropout: float | None = None) -> Any:
    """``CsmForConditionalGeneration`` with ``spec``'s weights (refused when they would leave part of it random)."""
    from transformers import CsmForConditionalGeneration

    source = _source(spec, what)
    config = auto_config(source, what)
    if getattr(config, "model_type", None) != "csm":
        raise ModelLoadError(f"{what}={spec!r} is a {getattr(config, 'model_type', '?')} model, not CSM; point it at "
                             "a CSM checkpoint in transformers' layout (e.g. sesame/csm-1b)")
    set_dropout(config, dropout)
    csm = from_pretrained_whole(CsmForConditionalGeneration, spec, source, what, config=config, dtype=DTYPES[dtype])
    return freeze(csm)


def set_dropout(config: Any, dropout: float | None) -> None:
    if dropout is not None:
        config.attention_dropout = dropout
        config.depth_decoder_config.attention_dropout = dropout


def freeze(csm: Any) -> Any:
    """The codec frozen and in eval mode (it encodes nothing in training: the codes come prepared)."""
    csm.codec_model.eval().requires_grad_(False)
    csm.generation_config._from_model_config = False  # else save/load drops the depth decoder's generation keys
    return csm


def random_config(cfg: Any, tokenizer: Any, data: DataSpec, codec_config: Any) -> Any:
    """A ``CsmConfig`` of ``cfg``'s sizes over the data's codebooks and the tokenizer's vocabulary."""
    from transformers import CsmConfig, CsmDepthDecoderConfig

    vocab = data.codebook_size + SPECIALS
    depth = CsmDepthDecoderConfig(
        num_codebooks=data.num_codebooks, backbone_hidden_size=cfg.hidden_size, vocab_size=vocab,
        hidden_size=cfg.depth_hidden_size, intermediate_size=cfg.depth_intermediate_size,
        num_hidden_layers=cfg.depth_layers, num_attention_heads=cfg.depth_heads,
        num_key_value_heads=max(1, cfg.depth_heads // 4), max_position_embeddings=data.num_codebooks + 1,
        attention_dropout=cfg.dropout)
    ids = tokenizer.convert_tokens_to_ids([tokenizer.bos_token])
    return CsmConfig(
        num_codebooks=data.num_codebooks, vocab_size=vocab, text_vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads, max_position_embeddings=2048,
        codebook_pad_token_id=vocab - 1, codebook_eos_token_id=0, bos_token_id=ids[0], attention_dropout=cfg.dropout,
        depth_decoder_config=depth.to_dict(), codec_config=codec_config.to_dict())


def data_mimi(data: DataSpec) -> Any:
    """The prepared data's Mimi (``index.json``'s codec path), the random model's codec."""
    from voxrelay.codecs.mimi import MIMI_SOURCE
    from voxrelay.codecs.pretrained import load_codec_model

    path = (data.codec or {}).get("path")
    if not path:
        raise ConfigError("model.family=csm without model.init_from takes its codec from the prepared data, whose "
                          "index.json names no codec.path; prepare with codec.type=mimi codec.path=kyutai/mimi")
    return load_codec_model(path, MIMI_SOURCE, "MimiModel")


def build_csm(cfg: Any, tokenizer: Any, data: DataSpec, seed: int, meta: bool) -> Any:
    """The model of ``cfg`` for ``data``: ``init_from``'s, else random (seeded by ``seed``) over the data's Mimi."""
    from transformers import CsmConfig, CsmForConditionalGeneration, MimiConfig

    if meta:
        if cfg.init_from and Path(cfg.init_from).expanduser().is_dir():
            config = auto_config(cfg.init_from)
        else:
            config = random_config(cfg, tokenizer, data, MimiConfig()) if tokenizer is not None else CsmConfig()
        with torch.device("meta"):
            return freeze(CsmForConditionalGeneration(config).to(DTYPES[cfg.weights_dtype]))
    if cfg.init_from:
        csm = load_csm(cfg.init_from, "model.init_from", cfg.weights_dtype, cfg.dropout)
    else:
        mimi = data_mimi(data)
        codec_config = copy.deepcopy(mimi.config)
        codec_config.num_quantizers = data.num_codebooks  # CSM's codec encodes as many codebooks as it reads
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            csm = CsmForConditionalGeneration(random_config(cfg, tokenizer, data, codec_config))
        kept = csm.codec_model.state_dict()  # the first K quantizers' codebooks: residual codes do not depend on later
        csm.codec_model.load_state_dict({k: v for k, v in mimi.state_dict().items() if k in kept})
        csm = freeze(csm.to(DTYPES[cfg.weights_dtype]))
    check_data(csm.config, data, cfg.init_from)
    return csm


def check_data(config: Any, data: DataSpec, init_from: str | None) -> None:
    """The data's codes must be what the model reads: its number of codebooks, codes within its vocabulary."""
    if data.num_codebooks != config.num_codebooks or data.codebook_size + SPECIALS > config.vocab_size:
        raise ConfigError(
            f"model.init_from={init_from!r} reads {config.num_codebooks} Mimi codebooks of "
            f"{config.vocab_size - SPECIALS} codes, but the prepared data has {data.num_codebooks} of "
            f"{data.codebook_size}; prepare with codec.type=mimi codec.num_codebooks={config.num_codebooks} "
            "(and the model's Mimi as codec.path, e.g. kyutai/mimi) under another data.name")


def load_tokenizer(spec: str, what: str) -> Any:
    """The Llama-3 tokenizer of ``spec``, with the BOS and EOS tokens CSM's turns are written with."""
    from transformers import AutoTokenizer

    if problem := missing_folder(spec, what, "set model.tokenizer to a Llama-3 tokenizer folder or hub id"):
        raise ModelNotFoundError(problem)
    try:
        tok = AutoTokenizer.from_pretrained(str(Path(spec).expanduser()) if Path(spec).expanduser().is_dir() else spec)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{what}={spec!r} has no loadable tokenizer ({one_line(e)[:300]}); set model.tokenizer "
                             "to a Llama-3 tokenizer folder or hub id (e.g. the one of sesame/csm-1b)") from e
    if tok.bos_token is None or tok.eos_token is None:
        raise ModelLoadError(f"{what}={spec!r}: its tokenizer has no BOS or EOS token, which every CSM turn is "
                             "written with; use CSM's (Llama-3's: <|begin_of_text|>, <|end_of_text|>)")
    return tok


def load(folder: str | os.PathLike[str]) -> Any:
    """A folder written by ``Csm.save_pretrained`` (no network access)."""
    from voxrelay.models.csm.model import Csm

    return Csm.from_pretrained(folder)
