"""The ``vibevoice`` model family: its :class:`~voxrelay.models.seam.FamilySpec` (imports no torch)."""

from voxrelay.models.seam import FamilySpec
from voxrelay.models.vibevoice.config import VibeVoiceFamilyConfig

SPEC = FamilySpec(
    name="vibevoice",
    config=VibeVoiceFamilyConfig,
    build="voxrelay.models.vibevoice.loading:build",
    load="voxrelay.models.vibevoice.loading:load_folder",
    summary="VibeVoice: a Qwen2 LM over dialogue scripts and voice prompts, latents by diffusion",
    fsdp_forward_methods=("generate_speech", "decode_means"),  # synthesis through the root, prompts decoded
    codecs={"vibevoice_latents": "voxrelay.models.vibevoice.latent_codec:VibeVoiceLatentCodec"},  # its encoders'
)
