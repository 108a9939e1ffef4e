"""The two device functions both Triton attention kernels are built from: gathering a tile of K/V
rows out of the pages, and folding a tile of scores into a running (online) softmax.

Used by triton_decode.py and triton_extend.py beside it, never launched alone.
A cache is [num_pages, block_size, kv_heads, head_dim] with head_dim contiguous; token `t` of a
request lives at page `block_table[t // block_size]`, slot `t % block_size`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The running max starts finite, so a row whose first tiles are all masked gets weights
# exp2(-inf - MIN) = 0 and a rescale exp2(0) = 1 instead of the NaN of (-inf) - (-inf).
SOFTMAX_MIN = tl.constexpr(-1.0e30)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def dot_precision(dtype: torch.dtype) -> str:
    """float32 caches multiply in full float32 ("ieee"), not TF32, so they match the reference."""
    return "ieee" if dtype == torch.float32 else "tf32"


@triton.jit
def load_kv_tile(k_cache_ptr, v_cache_ptr, table_row_ptr, head_offset, toks, tok_mask, dims, dim_mask,
                 stride_page, stride_slot, BLOCK_SIZE: tl.constexpr):
    """K and V rows of tokens `toks` ([BLOCK_N]) of one KV head: two [BLOCK_N, BLOCK_D] tiles.

    Masked tokens read nothing (not even their page id): their rows are 0.
    """
    pages = tl.load(table_row_ptr + toks // BLOCK_SIZE, mask=tok_mask, other=0).to(tl.int64)
    rows = pages * stride_page + (toks % BLOCK_SIZE) * stride_slot + head_offset  # [BLOCK_N]
    offsets = rows[:, None] + dims[None, :]
    mask = tok_mask[:, None] & dim_mask[None, :]
    k = tl.load(k_cache_ptr + offsets, mask=mask, other=0.0)
    v = tl.load(v_cache_ptr + offsets, mask=mask, other=0.0)
    return k, v


@triton.jit
def load_rows_tile(k_ptr, v_ptr, rows, row_mask, head, dims, dim_mask,
                   stride_k_row, stride_k_head, stride_v_row, stride_v_head):
    """K and V of rows `rows` ([BLOCK_N]) of one KV head read from [T, kv_heads, head_dim] tensors
    (the step's own keys, not the pages): two [BLOCK_N, BLOCK_D] tiles, 0 where masked."""
    mask = row_mask[:, None] & dim_mask[None, :]
    k_offsets = rows[:, None] * stride_k_row + head * stride_k_head + dims[None, :]
    v_offsets = rows[:, None] * stride_v_row + head * stride_v_head + dims[None, :]
    return tl.load(k_ptr + k_offsets, mask=mask, other=0.0), tl.load(v_ptr + v_offsets, mask=mask, other=0.0)


@triton.jit
def as_compute_dtype(k, v, q):
    """K and V tiles in q's dtype: an fp8 cache's values (scale 1) widened; otherwise no-ops."""
    return k.to(q.dtype), v.to(q.dtype)


@triton.jit
def softmax_step(acc, row_sum, row_max, scores, v, DOT_PRECISION: tl.constexpr):
    """Fold one tile into the running softmax of every query row.

    scores: [M, BLOCK_N] float32 in log2 units (scale * log2(e) applied), -inf where masked;
    acc: [M, BLOCK_D] float32 unnormalised output; row_sum, row_max: [M] float32.
    """
    new_max = tl.maximum(row_max, tl.max(scores, 1))
    rescale = tl.exp2(row_max - new_max)
    p = tl.exp2(scores - new_max[:, None])
    row_sum = row_sum * rescale + tl.sum(p, 1)
    acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, row_sum, new_max
