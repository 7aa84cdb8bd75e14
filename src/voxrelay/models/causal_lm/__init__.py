"""The ``causal_lm`` model family: its :class:`~voxrelay.models.seam.FamilySpec` (imports no torch)."""

from voxrelay.models.causal_lm.config import CausalLMConfig
from voxrelay.models.seam import FamilySpec

SPEC = FamilySpec(
    name="causal_lm",
    config=CausalLMConfig,
    build="voxrelay.models.causal_lm.build:build",
    load="voxrelay.models.causal_lm.build:load",
    summary="Any transformers causal LM over a codec's codes, laid out by a declared layout (Llasa, Orpheus, yours)",
)
