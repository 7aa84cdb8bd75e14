"""Build and load :class:`CodecLM` models (the ``codec_lm`` spec's ``build`` and ``load``)."""

from __future__ import annotations

import os
from pathlib import Path

from voxrelay.models.base import DataSpec
from voxrelay.models.codec_lm.config import CodecLMConfig
from voxrelay.models.codec_lm.loading import META_FILE
from voxrelay.models.codec_lm.model import CodecLM
from voxrelay.models.hf import auto_config


def build(cfg: CodecLMConfig, data: DataSpec, seed: int, meta: bool = False) -> CodecLM:
    model = CodecLM.build(cfg, data.num_codebooks, data.codebook_size, data.speakers, seed, meta=meta,
                          code_vectors=data.code_vectors)
    model.new_rows = new_rows(cfg, model)
    return model


def load(folder: str | os.PathLike[str]) -> CodecLM:
    return CodecLM.from_pretrained(folder)


def new_rows(cfg: CodecLMConfig, model: CodecLM) -> tuple[int, int]:
    """The ids grown onto a plain causal LM ``init_from`` ([start, end): the special and audio ids after its text
    rows); none for a voxrelay folder (trained already) or a random init."""
    if cfg.init_from is None or (Path(cfg.init_from) / META_FILE).is_file():
        return (0, 0)
    emb = model.module.get_input_embeddings() if hasattr(model.module, "get_input_embeddings") else None
    if emb is None or not hasattr(emb, "weight"):
        return (0, 0)
    return (auto_config(str(cfg.init_from)).vocab_size, emb.weight.shape[0])
