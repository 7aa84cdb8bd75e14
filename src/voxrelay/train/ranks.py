"""The processes of a job agreeing on CPU-side values: save and stop decisions, RNG states, the
checkpoint to resume from, the lease.

On GPUs the default process group is NCCL alone (accelerate adds ``cpu:gloo`` only for FSDP offload
or full state dicts), and NCCL has no CPU backend: a collective on CPU tensors raises "No backend
type associated with device type cpu". So these values never go through the default group: they go
as pickled objects over a gloo group of the job's own, made once at start-up by every process.
Training's own tensors (losses, token counts, gradients) stay on the device and the default group.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from voxrelay.errors import UserError


class Ranks:
    """This process's rank among ``world`` and the gloo group they agree over (None when alone)."""

    def __init__(self, group, rank: int, world: int):
        self.group = group
        self.rank = rank
        self.world = world

    @classmethod
    def of_job(cls, timeout_s: float = 1800.0) -> Ranks:
        """The job's processes (a collective: every process calls it at the same point). ``timeout_s``: how
        long a process waits for the others in one exchange (rank 0 may be uploading the last checkpoint)."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return cls(None, 0, 1)
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        return cls(group, dist.get_rank(), dist.get_world_size())

    def over(self, group) -> Ranks:
        """The same processes exchanging over another gloo ``group`` of them all (a saver thread's own)."""
        return Ranks(group, self.rank, dist.get_world_size(group))

    @property
    def main(self) -> bool:
        return self.rank == 0

    def gather(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, in rank order, on every process."""
        if self.group is None:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every process."""
        if self.group is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    def any(self, flag: bool) -> bool:
        """True on every process if it is True on any."""
        return any(self.gather(bool(flag)))

    def on_main(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on rank 0 and its result on every rank; its error stops every rank (the others would
        otherwise wait in the next exchange): rank 0 raises it, the others a UserError that names it."""
        result, error = None, None
        if self.main:
            try:
                result = fn()
            except Exception as err:
                error = err
        summary = self.broadcast(None if error is None else error if isinstance(error, UserError) else
                                 f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        if summary is not None:
            raise summary if isinstance(summary, UserError) else UserError(
                f"the main process (rank 0) failed: {summary}")
        return self.broadcast(result)

    def each(self, fn: Callable[[], Any], here: bool = True) -> Any:
        """``fn()`` on every rank where ``here`` (None elsewhere), then all wait for all (a collective); an error
        on any rank stops every rank (raised where it happened, a UserError naming it on the others)."""
        result, error = None, None
        if here:
            try:
                result = fn()
            except Exception as err:
                error = err
        failed = [(r, why) for r, why in enumerate(self.gather(error and f"{type(error).__name__}: {error}")) if why]
        if error is not None:
            raise error
        if failed:
            raise UserError(f"rank {failed[0][0]} failed: {failed[0][1]}")
        return result
