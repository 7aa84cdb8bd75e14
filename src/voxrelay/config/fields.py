"""Helpers shared by the sections of the run config (torch-free: ``--help`` and ``config show`` import them)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A section of the run config: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def switch_section(value: Any) -> Any:
    """An optional section written as a switch (``train.lora=true`` on a command line): ``true`` -> ``{}``
    (on, every key at its default), ``false`` -> None (off); anything else as it is."""
    return {} if value is True else None if value is False else value
