"""The typed ``model:`` section of each family, by name (the tag ``model.family``): with
:data:`voxrelay.models.registry.FAMILIES`, the only place a new family is named. Importing this module
imports no torch (``--help`` and ``config show`` read it)."""

from __future__ import annotations

from pydantic import BaseModel

from voxrelay.models.codec_lm.config import CodecLMConfig
from voxrelay.models.orpheus.config import OrpheusConfig
from voxrelay.models.parler.config import ParlerFamilyConfig
from voxrelay.models.vibevoice.config import VibeVoiceFamilyConfig

# the implementations are registered under the same names in voxrelay.models.registry (a test keeps the two in step)
FAMILY_CONFIGS: dict[str, type[BaseModel]] = {"codec_lm": CodecLMConfig, "orpheus": OrpheusConfig,
                                              "parler": ParlerFamilyConfig, "vibevoice": VibeVoiceFamilyConfig}
DEFAULT_FAMILY = "codec_lm"  # a `model:` section without `family` (configs older than families)
