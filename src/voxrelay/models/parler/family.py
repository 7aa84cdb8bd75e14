"""The ``parler`` entry of the family registry."""

from __future__ import annotations

import os
from pathlib import Path

from voxrelay.models.base import DataSpec
from voxrelay.models.parler.config import ParlerFamilyConfig
from voxrelay.models.parler.loading import build, load_folder
from voxrelay.models.parler.model import Parler


class ParlerFamily:
    """A :class:`~voxrelay.models.base.Family`: Parler-TTS (description-conditioned, DAC codes, delay pattern)."""

    name = "parler"

    def build(self, cfg: ParlerFamilyConfig, data: DataSpec, seed: int, meta: bool = False) -> Parler:
        return build(cfg, data, seed, meta=meta)

    def load(self, folder: str | os.PathLike[str]) -> Parler:
        return load_folder(Path(folder))
