"""The processes of a job agreeing on CPU-side values: save and stop decisions, RNG states, the
checkpoint to resume from, the lease.

On GPUs the default process group is NCCL alone (accelerate adds ``cpu:gloo`` only for FSDP offload
or full state dicts), and NCCL has no CPU backend: a collective on CPU tensors raises "No backend
type associated with device type cpu". So these values never go through the default group: they go
as pickled objects over a gloo group of the job's own, made once at start-up by every process.
Training's own tensors (losses, token counts, gradients) stay on the device and the default group.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist


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
