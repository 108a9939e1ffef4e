"""The tensor-parallel group of one replica: rank, size and the two collectives the model needs.

At tp=1 every collective is the identity and torch.distributed is never initialised, so a single
card (or a CPU test) needs no process group. Replicas (DP) never share a group.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1
    # The torch.distributed group of this replica's ranks; None at tp=1.
    group: object | None = None

    @property
    def is_first_rank(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place."""
        if self.size > 1:
            torch.distributed.all_reduce(x, group=self.group)
        return x

    def broadcast_from_first(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` on every rank, in place (a contiguous tensor)."""
        if self.size > 1:
            torch.distributed.broadcast(x, src=self._global_rank(0), group=self.group)
        return x

    def gather_to_first(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor | None:
        """Concatenate every rank's `x` along `dim` on rank 0; the other ranks get None."""
        if self.size == 1:
            return x
        if x.is_cuda and torch.distributed.get_backend(self.group) == "gloo":
            # gloo moves CUDA tensors only for broadcast and all-reduce; a gather goes through the host.
            gathered = self.gather_to_first(x.cpu(), dim)
            return None if gathered is None else gathered.to(x.device)
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.rank == 0 else None
        torch.distributed.gather(x, parts, dst=self._global_rank(0), group=self.group)
        return torch.cat(parts, dim=dim) if parts is not None else None

    def _global_rank(self, group_rank: int) -> int:
        if self.group is None:
            return group_rank
        return torch.distributed.get_global_rank(self.group, group_rank)


def init_tp_group(rank: int, size: int, init_method: str, backend: str, world_rank: int | None = None,
                  world_size: int | None = None, timeout_s: float = 600.0) -> TPGroup:
    """Join the process group of one replica's TP ranks (all ranks call this together)."""
    if size == 1:
        return TPGroup()
    torch.distributed.init_process_group(
        backend=backend,
        init_method=init_method,
        rank=rank if world_rank is None else world_rank,
        world_size=size if world_size is None else world_size,
        # A collective that a dead or stuck peer never joins fails after this, instead of hanging.
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return TPGroup(rank=rank, size=size, group=torch.distributed.group.WORLD)
