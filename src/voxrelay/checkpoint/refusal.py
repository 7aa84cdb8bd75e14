"""What a refused checkpoint file raises, and the line that says why: apart from :mod:`safe_dcp` so that a
process that never reads a sharded checkpoint need not import torch.distributed.checkpoint (0.8 s)."""

from __future__ import annotations

from voxrelay.checkpoint.store import CheckpointError


class UnsafeCheckpoint(CheckpointError):
    """A checkpoint file that would run code (or read outside its folder) if loaded: refused, never loaded."""


def refusal(err: BaseException) -> str:
    """The line of a ``torch.load(weights_only=True)`` refusal that says what it found (e.g. "Unsupported
    global: GLOBAL posix.system")."""
    lines = str(err).splitlines() or [type(err).__name__]
    found = [line.split("error:", 1)[-1].strip() for line in lines if "WeightsUnpickler error" in line]
    return (found or lines)[0][:200]
