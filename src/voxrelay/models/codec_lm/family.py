"""The ``codec_lm`` entry of the family registry: builds and loads :class:`CodecLM` models."""

from __future__ import annotations

import os

from voxrelay.models.base import DataSpec
from voxrelay.models.codec_lm.config import CodecLMConfig
from voxrelay.models.codec_lm.model import CodecLM


class CodecLMFamily:
    """A :class:`~voxrelay.models.base.Family`: a Llama over text ids + per-codebook audio ids."""

    name = "codec_lm"

    def build(self, cfg: CodecLMConfig, data: DataSpec, seed: int, meta: bool = False) -> CodecLM:
        return CodecLM.build(cfg, data.num_codebooks, data.codebook_size, data.speakers, seed, meta=meta,
                             code_vectors=data.code_vectors)

    def load(self, folder: str | os.PathLike[str]) -> CodecLM:
        return CodecLM.from_pretrained(folder)
