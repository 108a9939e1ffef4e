"""The reference attention backend: plain torch, one request at a time. Correct on CPU and GPU,
slow by design; the Triton kernels are checked against it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from core.execution.attention.backend import AttentionBackend, AttentionMetadata, write_kv
from core.execution.kv_cache import raw

# Queries per SDPA call for a long chunk: bounds the call's [heads, queries, keys] scores (an 8,192-
# token prompt's are 1 GB a layer for 4 heads in float32 taken whole); on the CPU an 8,190-token
# prompt of qwen3-tiny went 9.2 -> 3.3 s (benchmarks/NOTES.md).
_QUERY_BLOCK = 1024


class ReferenceAttention(AttentionBackend):
    name = "reference"

    def __init__(self, device: torch.device | str | None = None) -> None:
        """Built as every backend is, from its device, which it does not need: it runs wherever its
        tensors are."""

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        write_kv(k, v, k_cache, v_cache, meta.kv_index)
        block_size = k_cache.shape[1]
        out = torch.empty_like(q)
        block_table = meta.block_table.long()
        query_start = meta.query_start_cpu.tolist()
        for i, seq_len in enumerate(meta.seq_lens_cpu.tolist()):
            start, end = query_start[i], query_start[i + 1]
            if end == start:
                continue
            pages = block_table[i, : -(-seq_len // block_size)]
            # [seq_len, kv_heads, head_dim]: the request's whole context, read from its pages.
            # an fp8 cache gathered as bytes, then widened
            keys = raw(k_cache)[pages].view(k_cache.dtype).flatten(0, 1)[:seq_len].to(q.dtype)
            values = raw(v_cache)[pages].view(v_cache.dtype).flatten(0, 1)[:seq_len].to(q.dtype)
            # The chunk's tokens sit at positions seq_len - chunk .. seq_len - 1. One token (a decode)
            # sees the whole context and a whole prompt is plain causal: no mask is built for them
            # (the same products, bit for bit; most of a small model's steps are made of them).
            chunk, mask = end - start, None
            if chunk > _QUERY_BLOCK:
                _attend_in_blocks(q[start:end], keys, values, out[start:end], scale)
                continue
            if 1 < chunk < seq_len:
                query_pos = torch.arange(seq_len - chunk, seq_len, device=q.device)
                mask = torch.arange(seq_len, device=q.device)[None, :] <= query_pos[:, None]
            attended = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1),  # [q_heads, chunk, head_dim]
                keys.transpose(0, 1),
                values.transpose(0, 1),
                attn_mask=mask,
                is_causal=chunk == seq_len and chunk > 1,
                scale=scale,
                enable_gqa=True,
            )
            out[start:end] = attended.transpose(0, 1)
        return out


def _attend_in_blocks(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, out: torch.Tensor,
                      scale: float) -> None:
    """A chunk's attention `_QUERY_BLOCK` queries at a time into `out` ([chunk, heads, head_dim]):
    the chunk's tokens are the context's last, and each block sees the keys up to its last query."""
    chunk, seq_len = q.shape[0], keys.shape[0]
    offset = seq_len - chunk  # the chunk's first position
    for begin in range(0, chunk, _QUERY_BLOCK):
        end = min(chunk, begin + _QUERY_BLOCK)
        visible = offset + end
        query_pos = torch.arange(offset + begin, offset + end, device=q.device)
        mask = torch.arange(visible, device=q.device)[None, :] <= query_pos[:, None]
        out[begin:end] = F.scaled_dot_product_attention(
            q[begin:end].transpose(0, 1), keys[:visible].transpose(0, 1), values[:visible].transpose(0, 1),
            attn_mask=mask, scale=scale, enable_gqa=True,
        ).transpose(0, 1)
