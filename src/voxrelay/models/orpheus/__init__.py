"""The ``orpheus`` model family: its :class:`~voxrelay.models.seam.FamilySpec` (imports no torch)."""

from voxrelay.models.orpheus.config import OrpheusConfig
from voxrelay.models.seam import FamilySpec

SPEC = FamilySpec(
    name="orpheus",
    config=OrpheusConfig,
    build="voxrelay.models.orpheus.build:build",
    load="voxrelay.models.orpheus.build:load",
    summary="Orpheus-TTS: Llama-3 over SNAC 24 kHz codes, 7 per frame in its own id layout",
)
