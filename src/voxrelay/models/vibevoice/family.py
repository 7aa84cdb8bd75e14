"""The ``vibevoice`` entry of the family registry."""

from __future__ import annotations

import os
from pathlib import Path

from voxrelay.models.base import DataSpec
from voxrelay.models.vibevoice.config import VibeVoiceFamilyConfig
from voxrelay.models.vibevoice.loading import build, load_folder
from voxrelay.models.vibevoice.model import VibeVoice


class VibeVoiceFamily:
    """A :class:`~voxrelay.models.base.Family`: VibeVoice (dialogues, voice prompts, latents by diffusion)."""

    name = "vibevoice"

    def build(self, cfg: VibeVoiceFamilyConfig, data: DataSpec, seed: int, meta: bool = False) -> VibeVoice:
        return build(cfg, data, seed, meta=meta)

    def load(self, folder: str | os.PathLike[str]) -> VibeVoice:
        return load_folder(Path(folder))
