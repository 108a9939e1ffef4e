"""The attention backend interface: how a layer's attention reads and writes the paged KV cache.

Every backend takes the new tokens' q, k and v of one step (any mix of prefill chunks and
decodes), writes k and v into their pages, and attends each query over its request's pages,
causal inside the chunk. The model never knows which backend runs it. A backend is registered by
name in core/registry.py ATTENTION_BACKENDS and built by `make_backend` (this package's
__init__.py) as `cls(device)`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from core.execution.host_to_device import to_device
from core.execution.kv_cache import raw, to_cache_dtype
from core.plan import StepPlan


@dataclass(frozen=True)
class AttentionMetadata:
    """The plan's attention fields as device tensors, built once per step for every layer."""

    query_start: torch.Tensor  # int32 [B+1]
    seq_lens: torch.Tensor  # int32 [B]
    block_table: torch.Tensor  # int32 [B, W]
    kv_index: torch.Tensor  # int64 [T]
    # Host copies for backends that loop or size launches on the CPU.
    query_start_cpu: np.ndarray
    seq_lens_cpu: np.ndarray
    max_query_len: int
    max_seq_len: int
    # CUDA-graph capture: every request decodes one token, and launches must not depend on this
    # step's lengths (the host arrays only give the batch size; max_seq_len is an upper bound).
    static_shapes: bool = False

    @classmethod
    def from_plan(cls, plan: StepPlan, device: torch.device | str) -> AttentionMetadata:
        def put(array: np.ndarray) -> torch.Tensor:
            return to_device(array, torch.device(device))

        query_lens = np.diff(plan.query_start)
        return cls(
            query_start=put(plan.query_start),
            seq_lens=put(plan.seq_lens),
            block_table=put(plan.block_table),
            kv_index=put(plan.kv_index),
            query_start_cpu=np.asarray(plan.query_start),
            seq_lens_cpu=np.asarray(plan.seq_lens),
            max_query_len=int(query_lens.max()) if len(query_lens) else 0,
            max_seq_len=int(plan.seq_lens.max()) if len(plan.seq_lens) else 0,
        )


class AttentionBackend(ABC):
    name: str
    # Whether a CUDA graph may capture forward: given meta.static_shapes, its launches depend on the
    # tensors' shapes alone, never on the host arrays' values (core/execution/decode_graphs.py).
    supports_decode_graphs: bool = False

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, q_heads, head_dim]
        k: torch.Tensor,  # [T, kv_heads, head_dim]
        v: torch.Tensor,  # [T, kv_heads, head_dim]
        k_cache: torch.Tensor,  # [num_pages, block_size, kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [T, q_heads, head_dim]
        """Write k and v into their slots, then attend every query over its request's pages."""

    def launch_state(self) -> object | None:
        """What the last forward's launches read or write besides their arguments (scratch buffers):
        a CUDA graph captured over that forward must keep it alive for as long as it may replay.
        None when forward leaves nothing behind."""
        return None


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             kv_index: torch.Tensor) -> None:
    """Scatter the step's new K/V rows into the pages: slot = page * block_size + offset."""
    num_pages, block_size = k_cache.shape[:2]
    for rows, cache in ((k, k_cache), (v, v_cache)):
        raw(cache).view(num_pages * block_size, *cache.shape[2:]).index_copy_(
            0, kv_index, raw(to_cache_dtype(rows, cache.dtype)))
