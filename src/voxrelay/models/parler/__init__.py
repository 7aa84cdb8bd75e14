"""The ``parler`` model family: its :class:`~voxrelay.models.seam.FamilySpec` (imports no torch)."""

from voxrelay.models.parler.config import ParlerFamilyConfig
from voxrelay.models.seam import FamilySpec

SPEC = FamilySpec(
    name="parler",
    config=ParlerFamilyConfig,
    build="voxrelay.models.parler.loading:build",
    load="voxrelay.models.parler.loading:load_folder",
    summary="Parler-TTS: a description-conditioned decoder over DAC codes with the delay pattern",
    export_formats=("parler",),  # `voxrelay export --format parler`: upstream's own layout
    fsdp_forward_methods=("encode", "decode"),  # generation calls these instead of forward
    importers={"parler-config": "voxrelay.models.parler.importer:import_config"},
)
