"""The ``codec_lm`` model family: its :class:`~voxrelay.models.seam.FamilySpec` (imports no torch)."""

from voxrelay.models.codec_lm.config import CodecLMConfig
from voxrelay.models.seam import FamilySpec

SPEC = FamilySpec(
    name="codec_lm",
    config=CodecLMConfig,
    build="voxrelay.models.codec_lm.build:build",
    load="voxrelay.models.codec_lm.build:load",
    summary="a Llama (or any causal LM) over text ids and per-codebook audio ids of any codec",
)
