"""The paged KV cache tensors of one rank: for every layer, K and V of shape
[num_pages, block_size, kv_heads_per_rank, head_dim]. Which page belongs to whom is the
scheduler's business (core/scheduling/block_pool.py); this file only holds the memory."""

from __future__ import annotations

import torch


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
