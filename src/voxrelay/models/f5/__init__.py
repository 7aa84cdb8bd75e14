"""The ``f5`` model family: its :class:`~voxrelay.models.seam.FamilySpec` (imports no torch)."""

from voxrelay.models.f5.config import F5Config
from voxrelay.models.seam import FamilySpec

SPEC = FamilySpec(
    name="f5",
    config=F5Config,
    build="voxrelay.models.f5.loading:build",
    load="voxrelay.models.f5.loading:load",
    summary="F5-TTS: a DiT filling masked log-mel by flow matching, voice prompts from the data, Vocos out",
)
