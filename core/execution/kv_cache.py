"""The paged KV cache tensors of one rank: for every layer, K and V of shape
[num_pages, block_size, kv_heads_per_rank, head_dim]. Which page belongs to whom is the
scheduler's business (core/scheduling/block_pool.py); this file only holds the memory.

In the model's dtype, or (`--kv-cache-dtype fp8`) in float8 e4m3 with a scale of 1, as vLLM's
fp8 KV cache without calibrated scales: half the bytes a token, so twice the tokens in the same
memory and half the K/V read by decode attention. Written rows are clamped to +-448 and rounded
to nearest (`to_cache_dtype`, and the Triton write kernel alike); the attention kernels widen each
tile to the query's dtype after loading it.
"""

from __future__ import annotations

import torch

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_KV_MAX = 448.0


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """K or V rows as the cache stores them: an fp8 cache saturates instead of overflowing."""
    if dtype == FP8_KV_DTYPE:
        return x.float().clamp(-FP8_KV_MAX, FP8_KV_MAX).to(dtype)
    return x.to(dtype)


def raw(x: torch.Tensor) -> torch.Tensor:
    """x for indexing ops: fp8 as its bytes (torch's CPU index_copy_ and gathers do not take fp8)."""
    return x.view(torch.uint8) if x.dtype == FP8_KV_DTYPE else x


class KVCache:
    def __init__(self, num_layers: int, num_pages: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.num_pages = num_pages
        self.block_size = block_size
        # One allocation: [layers, 2 (K, V), num_pages, block_size, kv_heads, head_dim].
        self.storage = torch.zeros(num_layers, 2, num_pages, block_size, kv_heads, head_dim,
                                   dtype=dtype, device=device)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.storage[index, 0], self.storage[index, 1]

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()

    @staticmethod
    def bytes_per_page(num_layers: int, block_size: int, kv_heads: int, head_dim: int,
                       dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * kv_heads * head_dim * itemsize
