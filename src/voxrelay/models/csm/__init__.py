"""The ``csm`` model family: its :class:`~voxrelay.models.seam.FamilySpec` (imports no torch)."""

from voxrelay.models.csm.config import CsmConfig
from voxrelay.models.seam import FamilySpec

SPEC = FamilySpec(
    name="csm",
    config=CsmConfig,
    build="voxrelay.models.csm.build:build",
    load="voxrelay.models.csm.loading:load",
    summary="Sesame CSM: a Llama backbone and depth decoder over Mimi frames, trained on conversations in context",
    fsdp_forward_methods=("generate_speech",),  # synthesis through the root
)
