"""Files of codec_lm: building the transformers module, ``init_from`` (a voxrelay folder or a plain
causal LM, whose embeddings get the special and audio ids), and the ``voxrelay.json`` metadata."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel

from voxrelay.models import hf
from voxrelay.models.codec_lm.config import CodecLMConfig
from voxrelay.models.codec_lm.tokenizer import (
    TextTokenizer,
    load_saved_tokenizer,
    load_text_tokenizer,
)
from voxrelay.models.codec_lm.vocab import VocabLayout
from voxrelay.models.hf import (  # noqa: F401  (ModelLoadError, ModelNotFoundError: re-exported)
    ModelLoadError,
    ModelNotFoundError,
    auto_config,
    load_causal_lm,
)
from voxrelay.paths import EXPORT_META

FORMAT_VERSION = 1
META_FILE = EXPORT_META
TOKENIZER_DIR = "tokenizer"


def llama_config(cfg: CodecLMConfig, layout: VocabLayout) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=layout.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_seq_len,
        attention_dropout=cfg.dropout,
        tie_word_embeddings=False,
        pad_token_id=layout.pad_id,
        bos_token_id=layout.bos_id,
        eos_token_id=layout.audio_end_id,
    )


def read_meta(folder: Path) -> dict[str, Any]:
    return hf.read_meta(folder, "codec_lm", FORMAT_VERSION)


def load_init(
    cfg: CodecLMConfig, num_codebooks: int, codebook_size: int
) -> tuple[PreTrainedModel, TextTokenizer, VocabLayout]:
    """Weights, tokenizer and layout for ``cfg.init_from`` (a voxrelay folder or a plain causal LM)."""
    source = str(cfg.init_from)
    kwargs = {"attn_implementation": "sdpa", "attention_dropout": cfg.dropout}
    if (Path(source) / META_FILE).is_file():
        meta = read_meta(Path(source))
        layout = VocabLayout.from_dict(meta["layout"])
        if cfg.audio_embedding == "codec":
            raise ModelLoadError(
                f"model.init_from={source!r} is a voxrelay folder: its audio rows are saved as plain embeddings, "
                "so it fine-tunes with model.audio_embedding=free; set model.audio_embedding=free"
            )
        if meta.get("frames_per_position") != cfg.frames_per_position:
            raise ModelLoadError(
                f"model.init_from={source!r} was trained with frames_per_position "
                f"{meta.get('frames_per_position')} but model.frames_per_position is {cfg.frames_per_position}; "
                f"set model.frames_per_position={json.dumps(meta.get('frames_per_position'))}"
            )
        if (layout.num_codebooks, layout.codebook_size) != (num_codebooks, codebook_size):
            raise ModelLoadError(
                f"model.init_from={source!r} was trained on {layout.num_codebooks} codebooks x "
                f"{layout.codebook_size} codes but the data has {num_codebooks} x {codebook_size}; "
                "prepare the data with the same codec or start from another model"
            )
        if meta["tokenizer"] != cfg.tokenizer:
            raise ModelLoadError(
                f"model.init_from={source!r} uses tokenizer {meta['tokenizer']!r} but model.tokenizer is "
                f"{cfg.tokenizer!r}; set model.tokenizer={meta['tokenizer']}"
            )
        if meta.get("text_position_scale") != cfg.text_position_scale:
            raise ModelLoadError(
                f"model.init_from={source!r} was trained with text_position_scale "
                f"{meta.get('text_position_scale')} but model.text_position_scale is {cfg.text_position_scale}; "
                f"set model.text_position_scale={json.dumps(meta.get('text_position_scale'))}"
            )
        tokenizer = load_saved_tokenizer(Path(source) / TOKENIZER_DIR)
        return load_causal_lm(source, "model.init_from", **kwargs), tokenizer, layout
    tokenizer = load_text_tokenizer(cfg.tokenizer)
    module = load_causal_lm(source, "model.init_from", **kwargs)
    lm_vocab = module.get_input_embeddings().weight.shape[0]
    if tokenizer.vocab_size > lm_vocab:
        raise ModelLoadError(
            f"model.tokenizer={cfg.tokenizer!r} has {tokenizer.vocab_size} ids but model.init_from={source!r} "
            f"embeds only {lm_vocab}; set model.tokenizer to the tokenizer of {source!r}"
        )
    # Special and audio ids go after every row the pretrained model has, so no text row is reused.
    layout = VocabLayout(lm_vocab, num_codebooks, codebook_size)
    module.resize_token_embeddings(layout.vocab_size)
    module.config.pad_token_id = layout.pad_id
    module.config.bos_token_id = layout.bos_id
    module.config.eos_token_id = layout.audio_end_id
    return module, tokenizer, layout


def meta_init(
    cfg: CodecLMConfig, num_codebooks: int, codebook_size: int
) -> tuple[PreTrainedModel, TextTokenizer, VocabLayout]:
    """What :func:`load_init` (or a random init) gives, with the module on the meta device: shapes
    and parameter counts for planning, no weights read (only config.json of ``init_from``)."""
    source = cfg.init_from
    if source and (Path(source) / META_FILE).is_file():
        layout = VocabLayout.from_dict(read_meta(Path(source))["layout"])
        tokenizer = load_saved_tokenizer(Path(source) / TOKENIZER_DIR)
        lm_config = auto_config(source)
    elif source:
        tokenizer = load_text_tokenizer(cfg.tokenizer)
        lm_config = auto_config(source)
        layout = VocabLayout(lm_config.vocab_size, num_codebooks, codebook_size)
    else:
        tokenizer = load_text_tokenizer(cfg.tokenizer)
        layout = VocabLayout(tokenizer.vocab_size, num_codebooks, codebook_size)
        lm_config = llama_config(cfg, layout)
    lm_config.vocab_size = layout.vocab_size  # as resize_token_embeddings leaves a plain LM
    with torch.device("meta"):
        module = AutoModelForCausalLM.from_config(lm_config, attn_implementation="sdpa")
    return module, tokenizer, layout
