"""The tensor-parallel group of one replica: rank, size and the collectives the model needs (small
all-reduces through the one-shot kernel of core/execution/custom_all_reduce.py where the GPUs can
map each other's memory), and joining it at start-up.

At tp=1 every collective is the identity and torch.distributed is never initialised, so a single
card (or a CPU test) needs no process group. Replicas (DP) never share a group.

Joining fails fast and names who is missing. Rank 0 hosts the rendezvous store, and joining goes
in three phases, each within the timeout: every rank writes its key and waits for its peers'
(polling, so that a timeout can say which ranks never came), then the process group forms on that
store, then one all-reduce must return the group size (an NCCL communicator is built on that first
collective: it is where cards that cannot reach each other show it). Each rank marks in the store
when it enters a phase, so a rank that gives up names the peers that never entered it.
torch.distributed alone would wait its default ten minutes and say only that a timeout passed.
"""

from __future__ import annotations

import dataclasses
import datetime
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import torch

from core.execution.custom_all_reduce import CustomAllReduce, connect

_JOIN_POLL_S = 0.05


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1
    # The torch.distributed group of this replica's ranks; None at tp=1 (every collective is the
    # identity). A one-rank group is allowed: its collectives run (tests of the TP code paths).
    group: object | None = None
    # The one-shot kernel for small all-reduces (core/execution/custom_all_reduce.py); None: every
    # all-reduce goes through torch.distributed.
    custom_all_reduce: CustomAllReduce | None = None

    @property
    def is_first_rank(self) -> bool:
        return self.rank == 0

    @property
    def backend(self) -> str | None:
        return None if self.group is None else torch.distributed.get_backend(self.group)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place: the custom kernel where it takes x, else the collective
        library (the choice depends on x's size only, so every rank makes the same one)."""
        if self.custom_all_reduce is not None and self.custom_all_reduce.fits(x):
            return self.custom_all_reduce(x)
        if self.group is not None:
            torch.distributed.all_reduce(x, group=self.group)
        return x

    def captures_all_reduce(self, num_bytes: int) -> bool:
        """Whether a CUDA graph can capture the all-reduce of a message of `num_bytes`: no collective,
        the custom kernel, or NCCL (gloo moves CUDA tensors through the host)."""
        custom = self.custom_all_reduce
        fits = custom is not None and num_bytes <= custom.max_bytes
        return self.group is None or fits or self.backend == "nccl"

    def broadcast_from_first(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` on every rank, in place (a contiguous tensor)."""
        if self.group is not None:
            torch.distributed.broadcast(x, src=self._global_rank(0), group=self.group)
        return x

    def gather_to_first(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor | None:
        """Concatenate every rank's `x` along `dim` on rank 0; the other ranks get None."""
        if self.group is None or self.size == 1:
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


def _listening(host: str, port: int, deadline: float) -> bool:
    """Whether something accepts connections at host:port before `deadline` (time.monotonic())."""
    while True:
        try:
            wait_s = max(0.05, min(1.0, deadline - time.monotonic()))
            with socket.create_connection((host, port), timeout=wait_s):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


class TPStartupError(RuntimeError):
    """A rank could not join its TP group; the message names the rank, its device and the missing peers."""


def init_tp_group(rank: int, size: int, init_method: str, backend: str, device: str = "cpu",
                  timeout_s: float = 120.0, custom_all_reduce_bytes: int = 0) -> TPGroup:
    """Join the process group of one replica's TP ranks (all ranks call this together).

    `init_method` is "tcp://host:port", where rank 0 hosts the rendezvous. Within `timeout_s` every
    rank must arrive and a first all-reduce must complete, or TPStartupError names who did not; the
    same timeout then bounds every collective of the group. On GPUs, a positive
    `custom_all_reduce_bytes` sets up the one-shot kernel for all-reduces up to that size (the whole
    group turns it on, or off with one log line saying why)."""
    if size == 1:
        return TPGroup()
    me = f"tp={rank} on {device}"
    timeout = datetime.timedelta(seconds=timeout_s)
    address = urlsplit(init_method)
    if address.scheme != "tcp" or address.hostname is None or address.port is None:
        raise ValueError(f"{me}: the TP rendezvous must be tcp://host:port, not {init_method!r}")
    role = "start the rendezvous" if rank == 0 else "reach the rendezvous that tp=0 hosts"
    unreachable = (f"{me} could not {role} at {address.netloc} within {timeout_s:g} s "
                   "(tp=0 not started, or not reachable)")
    # torch's TCPStore client retries with a random back-off past its timeout (9 s for 3 s seen):
    # wait for the port ourselves, so the deadline is the timeout.
    if rank != 0 and not _listening(address.hostname, address.port, time.monotonic() + timeout_s):
        raise TPStartupError(unreachable)
    try:
        store = torch.distributed.TCPStore(address.hostname, address.port, size, is_master=rank == 0,
                                           timeout=timeout, wait_for_workers=False)
    except RuntimeError as exc:
        raise TPStartupError(f"{unreachable}: {_first_line(exc)}") from None
    _arrive(store, "joined", rank)
    missing = _await_peers(store, "joined", size, time.monotonic() + timeout_s)
    if missing:
        raise TPStartupError(f"{me}: {_ranks(missing)} of {size} ranks did not join the TP group within "
                             f"{timeout_s:g} s (--dist-timeout)")
    _arrive(store, "connecting", rank)
    try:
        # A collective that a dead or stuck peer never joins fails after `timeout`, instead of hanging.
        torch.distributed.init_process_group(backend=backend, store=store, rank=rank, world_size=size,
                                             timeout=timeout)
    except RuntimeError as exc:
        raise TPStartupError(f"{me}: the {backend} process group did not form within {timeout_s:g} s "
                             f"(--dist-timeout){_stalled(store, 'connecting', size, rank)}: "
                             f"{_first_line(exc)}") from None
    group = TPGroup(rank=rank, size=size, group=torch.distributed.group.WORLD)
    _first_all_reduce(group, device, me, timeout_s, store)
    if custom_all_reduce_bytes > 0 and device.startswith("cuda"):
        custom = connect(store, rank, size, torch.device(device), custom_all_reduce_bytes)
        group = dataclasses.replace(group, custom_all_reduce=custom)
    return group


def _arrive(store, phase: str, rank: int) -> None:
    """Record in the rendezvous store that `rank` has reached `phase` of joining."""
    store.set(f"cadence/{phase}/{rank}", "1")


def _await_peers(store, phase: str, size: int, deadline: float) -> list[int]:
    """The ranks that have not reached `phase` by `deadline` (none: all have)."""
    missing = list(range(size))
    while True:
        missing = [r for r in missing if not store.check([f"cadence/{phase}/{r}"])]
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(_JOIN_POLL_S)


def _stalled(store, phase: str, size: int, rank: int) -> str:
    """", waiting for tp=1, which never got this far" when peers are behind `phase`, for a message."""
    try:
        behind = [r for r in _await_peers(store, phase, size, deadline=0.0) if r != rank]
    except RuntimeError:  # the store went with rank 0
        return ""
    return f", waiting for {_ranks(behind)}, which never got this far" if behind else ""


def _ranks(ranks: list[int]) -> str:
    return ", ".join(f"tp={r}" for r in ranks)


def _first_all_reduce(group: TPGroup, device: str, me: str, timeout_s: float, store) -> None:
    """One all-reduce of a 1 over the group must give the group size within `timeout_s`."""
    probe = torch.ones(1, device=device)
    _arrive(store, "reducing", group.rank)
    try:
        work = torch.distributed.all_reduce(probe, group=group.group, async_op=True)
        work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        total = probe.item()
    except RuntimeError as exc:
        raise TPStartupError(f"{me}: the TP group's first all-reduce did not complete within {timeout_s:g} s "
                             f"(--dist-timeout){_stalled(store, 'reducing', group.size, group.rank)}: "
                             f"{_first_line(exc)}") from None
    if total != group.size:
        raise TPStartupError(f"{me}: the TP group's first all-reduce summed {total:g}, expected "
                             f"{group.size}: the {torch.distributed.get_backend(group.group)} transport "
                             "between the ranks is broken")


def _first_line(exc: Exception) -> str:
    """torch.distributed's errors carry a C++ stack trace after their first line."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
