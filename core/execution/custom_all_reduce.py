"""CustomAllReduce: the TP group's all-reduce for small messages, one kernel that CUDA graphs capture.

A decode step of Qwen3-14B makes two all-reduces per layer of batch x 5,120 values (10 KB a token
in bf16). NCCL spends most of such a call in its protocol; the one-shot kernel of
core/execution/all_reduce_kernel.py has every rank read its peers' copies straight out of their
memory and sum them, one launch, no host involvement. Messages above `max_bytes` go through the
collective library (tpgroup's choice, by size: the same on every rank).

Start-up (`connect`, every rank of the group together, within the rendezvous store's timeout):
each rank allocates its exchange buffer (all_reduce_kernel's layout: two data halves of `max_bytes`
and the flags) and publishes a CUDA IPC handle of it with its GPU's UUID (as JSON, no pickle:
core/execution/ipc_handle.py); each maps every peer's buffer, after checking that it can (the
peer's GPU visible here under the same index, and peer access between the two cards: two ranks
sharing one card always can). Every rank then publishes its verdict and all of them read all
verdicts, so the group turns the kernel on or off as one: a rank that used it while a peer waited
in NCCL would hang both. Off, rank 0 logs one line naming the reason. A rank that dies leaves
its peers' programs waiting on its flags inside the kernel; the launcher's supervision, which
ends the whole replica when one rank dies, is what ends them.
"""

from __future__ import annotations

import json
import logging

import torch

from core.execution.ipc_handle import open_shared, share

log = logging.getLogger(__name__)

# Largest message (bytes) the kernel takes: a decode batch of up to 102 tokens of Qwen3-14B in
# bf16; larger ones go through NCCL. benchmarks/all_reduce.py measures the crossover on a machine
# with several GPUs; one-shot reads (ranks - 1) x the message from peers, so it loses to NCCL's
# ring for large messages.
DEFAULT_MAX_BYTES = 1 << 20

_FLAG_BYTES = 4  # one int32 flag per (source rank, program)
_AGREED = "ok"  # a rank's verdict when it can map every peer's buffer


def exchange_buffer_bytes(world: int, max_bytes: int) -> int:
    """Bytes of one rank's exchange buffer: two data halves, then the flags."""
    from core.execution.all_reduce_kernel import MAX_PROGRAMS

    return 2 * max_bytes + world * MAX_PROGRAMS * _FLAG_BYTES


class CustomAllReduce:
    """The one-shot all-reduce over `buffers` (every rank's exchange buffer as mapped in this
    process, this rank's own at index `rank`), each zeroed before any rank's first call."""

    def __init__(self, rank: int, buffers: list[torch.Tensor], max_bytes: int) -> None:
        from core.execution.all_reduce_kernel import MAX_PROGRAMS, one_shot_all_reduce

        self._kernel = one_shot_all_reduce
        if max_bytes <= 0 or max_bytes % 16:
            raise ValueError(f"the custom all-reduce's max_bytes must be a positive multiple of 16, "
                             f"not {max_bytes}")
        self.rank, self.world, self.max_bytes = rank, len(buffers), max_bytes
        device = buffers[rank].device
        self.device = device
        self._buffers = buffers  # the peers' mappings live as long as these tensors
        self._data_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=device)
        self._flag_ptrs = torch.tensor([b.data_ptr() + 2 * max_bytes for b in buffers], dtype=torch.int64,
                                       device=device)
        self._epochs = torch.zeros(MAX_PROGRAMS, dtype=torch.int32, device=device)

    def fits(self, x: torch.Tensor) -> bool:
        """Whether the kernel takes `x` (tpgroup sends the rest through the collective library)."""
        return (x.device == self.device and x.is_contiguous()
                and x.numel() * x.element_size() <= self.max_bytes)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place (every rank calls with the same shape and dtype)."""
        return self._kernel(x, self._data_ptrs, self._flag_ptrs, self._epochs, self.rank, self.world,
                            self.max_bytes // x.element_size())


def connect(store, rank: int, world: int, device: torch.device, max_bytes: int = DEFAULT_MAX_BYTES
            ) -> CustomAllReduce | None:
    """The group's CustomAllReduce on every rank, or None on every rank (rank 0 logs why).

    `store`: the group's rendezvous store (torch.distributed.Store), whose get waits at most the
    group's timeout."""
    buffer, reason = None, None
    try:
        buffer = torch.zeros(exchange_buffer_bytes(world, max_bytes), dtype=torch.uint8, device=device)
        torch.cuda.synchronize(device)  # zeroed before any peer can write a flag into it
        offer = {"uuid": _uuid(device.index), "index": device.index, "handle": share(buffer).decode()}
    except Exception as exc:  # noqa: BLE001 - any failure turns the kernel off, with its reason
        reason = f"tp={rank} could not share its buffer: {_first_line(exc)}"
        offer = {"error": reason}
    store.set(_key("offer", rank), json.dumps(offer))
    offers = [offer if r == rank else json.loads(store.get(_key("offer", r))) for r in range(world)]
    buffers: list[torch.Tensor] = []
    if reason is None:
        reason = next((o["error"] for o in offers if "error" in o), None)
    if reason is None:
        reason = _unmappable_peer(rank, device, offers)
    if reason is None:
        try:
            buffers = [buffer if r == rank else open_shared(o["handle"].encode())
                       for r, o in enumerate(offers)]
        except Exception as exc:  # noqa: BLE001
            reason = f"tp={rank} could not map a peer's buffer: {_first_line(exc)}"
    store.set(_key("verdict", rank), reason or _AGREED)
    verdicts = [reason or _AGREED if r == rank else store.get(_key("verdict", r)).decode()
                for r in range(world)]
    refusal = next((v for v in verdicts if v != _AGREED), None)
    if refusal is not None:
        if rank == 0:
            log.warning("custom all-reduce off: %s; every all-reduce goes through the collective library",
                        refusal)
        return None
    return CustomAllReduce(rank, buffers, max_bytes)


def _unmappable_peer(rank: int, device: torch.device, offers: list[dict]) -> str | None:
    """Why this rank cannot map some peer's buffer, or None: it can map them all."""
    for peer, offer in enumerate(offers):
        if peer == rank or offer["uuid"] == _uuid(device.index):
            continue
        index = offer["index"]
        if index >= torch.cuda.device_count() or _uuid(index) != offer["uuid"]:
            return (f"tp={peer}'s GPU (cuda:{index} there) is not cuda:{index} for tp={rank} "
                    "(the ranks see different CUDA_VISIBLE_DEVICES)")
        if not torch.cuda.can_device_access_peer(device.index, index):
            return (f"cuda:{device.index} (tp={rank}) cannot map the memory of cuda:{index} (tp={peer}): "
                    "no peer access")
    return None


def _uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def _key(what: str, rank: int) -> str:
    return f"cadence/custom_all_reduce/{what}/{rank}"


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
