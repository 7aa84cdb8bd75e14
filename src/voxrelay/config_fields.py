"""Helpers shared by the sections of the run config (torch-free: ``--help`` and ``config show`` import them)."""

from __future__ import annotations

from typing import Any


def switch_section(value: Any) -> Any:
    """An optional section written as a switch (``train.lora=true`` on a command line): ``true`` -> ``{}``
    (on, every key at its default), ``false`` -> None (off); anything else as it is."""
    return {} if value is True else None if value is False else value
