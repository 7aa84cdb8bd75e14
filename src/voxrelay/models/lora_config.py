"""The ``train.lora`` section of a run config (used by :mod:`voxrelay.train.strategies`).

Imported by :mod:`voxrelay.config`, so it must stay free of torch/peft (``--help`` and ``config show``
import it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class LoraConfig(BaseModel):
    """``train.lora``: low-rank adapters (peft) on the family's layers instead of a full fine-tune.

    Every key left unset (None) takes the model family's default (``FamilyModel.lora_defaults``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    r: int | None = Field(None, gt=0, description="Rank of the adapters (None = the family's default)")
    alpha: float | None = Field(
        None, gt=0, description="Scale numerator: updates are scaled by alpha/r, or alpha/sqrt(r) with rslora "
        "(None = the family's default)",
    )
    dropout: float | None = Field(
        None, ge=0, lt=1, description="Dropout on the adapters' input (None = the family's default)"
    )
    rslora: bool | None = Field(
        None, description="Rank-stabilised scaling alpha/sqrt(r) instead of alpha/r (None = the family's default)"
    )
    target_modules: list[str] | str | None = Field(
        None, description="Module names that get adapters, a regex over full module names, or 'all-linear' "
        "(None = the family's default)",
    )
    modules_to_save: list[str] | None = Field(
        None, description="Modules trained in full beside the adapters (e.g. [lm_head, embed_tokens] when the "
        "vocabulary has new ids); [] for none (None = the family's default)",
    )
    base_bits: Literal[4, 8] | None = Field(
        None, description="QLoRA: quantise the frozen base's layer Linears with bitsandbytes (`pip install "
        "voxrelay[bnb]`): 4 = NF4 with double quantisation (~0.52 bytes/weight), 8 = LLM.int8 (~1 byte/weight); "
        "re-quantised from the base each session, never stored in checkpoints; ddp only (not fsdp). null: the "
        "base in its dtype",
    )
