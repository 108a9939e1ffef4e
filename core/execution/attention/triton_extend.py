"""Paged prefill/extend attention in Triton: chunks of new queries over cached prefix plus themselves.

Called by TritonAttention for the requests of a step whose query length is 2 or more. A request
with `chunk` new tokens and context `seq_len` has its queries at positions seq_len - chunk ..
seq_len - 1; their K/V are already in the pages (written first by the backend), so the kernel
reads every key from pages and masks causally. A step whose extending requests have no cached
prefix (fresh prompts) reads them from the step's own K/V rows instead (FRESH): the same values
without the page table's dependent loads, 14-16 % faster on an H100 (1,784 tokens: 120.8 -> 104.4
us a layer; `python -m benchmarks.prefill_attention`). Prefill is compute-bound, so this kernel is shaped
like flash attention: a tile of BLOCK_M query rows of one head against BLOCK_N keys at a time,
with the causal mask applied only on the tiles that cross the diagonal.

The launch is a flat list of (request, query block) tiles built on the host from the plan's
query_start, heaviest tiles first, so that no program is launched for nothing and the long
tail of a causal prefill starts early.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from core.execution.attention.triton_tiles import (
    SOFTMAX_MIN,
    as_compute_dtype,
    dot_precision,
    load_kv_tile,
    load_rows_tile,
    next_power_of_2,
    softmax_step,
)


class ExtendTiles(NamedTuple):
    block_m: int  # query rows per program
    block_n: int  # keys per loop iteration
    num_warps: int
    num_stages: int


def extend_tiles(dtype: torch.dtype, max_query_len: int, max_keys: int) -> ExtendTiles:
    """The tile for a step whose longest chunk has max_query_len queries and whose longest request
    reads max_keys keys. Chosen by the H200 sweep (python -m benchmarks.kernels --sweep)."""
    if dtype == torch.float32:
        # float32 multiplies on the CUDA cores ("ieee"); larger tiles spill registers on sm_90.
        return ExtendTiles(block_m=16, block_n=32, num_warps=8, num_stages=2)
    if max_query_len <= 64:
        # Short chunks (a few tokens each): a 128-row tile would be mostly padding.
        return ExtendTiles(block_m=64, block_n=64, num_warps=4, num_stages=2)
    if max_keys <= 512:
        # Few keys a tile: more, smaller programs fill the 132 SMs (4 x 512 fresh: 58 us, 128 x 128: 71).
        return ExtendTiles(block_m=64, block_n=32, num_warps=4, num_stages=2)
    # Two Hopper warpgroups over 128 x 128 tiles, three stages: the best of 48 tiles on a 2,048-token
    # prompt (146 us), 4 x 512 after 1,536 cached (238) and 64 x 128 after 2,048 cached (1,073);
    # 64 x 64 tiles were 3 %, 11 % and 14 % slower there.
    return ExtendTiles(block_m=128, block_n=128, num_warps=8, num_stages=3)


def extend_work_list(query_start_cpu: np.ndarray, seq_lens_cpu: np.ndarray, block_m: int) -> np.ndarray:
    """int32 [2, num_tiles]: the request and query block of every tile, requests with query length
    >= 2 only, sorted by how many keys the tile reads, most first."""
    query_lens = np.diff(query_start_cpu).astype(np.int64)
    reqs = np.flatnonzero(query_lens >= 2)
    blocks = -(-query_lens[reqs] // block_m)
    tile_req = np.repeat(reqs, blocks)
    ends = np.cumsum(blocks)
    tile_block = np.repeat(ends, blocks) - 1 - np.arange(int(ends[-1]) if len(ends) else 0)
    prefix = seq_lens_cpu[tile_req].astype(np.int64) - query_lens[tile_req]
    keys_read = prefix + np.minimum((tile_block + 1) * block_m, query_lens[tile_req])
    order = np.argsort(-keys_read, kind="stable")
    return np.stack([tile_req[order], tile_block[order]]).astype(np.int32)


# The table stride and the work list's address change from step to step: not specialized on, so
# one compiled variant per tile (see _decode_split_kernel).
@triton.jit(do_not_specialize=["stride_table_req"],
            do_not_specialize_on_alignment=["tile_req_ptr", "tile_block_ptr"])
def _extend_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_table_ptr, seq_lens_ptr, query_start_ptr,
    tile_req_ptr, tile_block_ptr, scale_log2e,
    stride_q_tok, stride_q_head, stride_out_tok, stride_out_head,
    stride_cache_page, stride_cache_pos, stride_cache_head, stride_table_req,
    k_ptr, v_ptr, stride_k_tok, stride_k_head, stride_v_tok, stride_v_head,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, FRESH: tl.constexpr,
):
    """FRESH: every request of the work list has no cached prefix, and its keys are read from the
    step's own K/V rows (k_ptr, v_ptr) instead of the pages: no page table, no gather."""
    # Heads vary fastest, so the GROUP programs sharing a KV head run together and share it in L2.
    head = tl.program_id(0)
    tile = tl.program_id(1)
    req = tl.load(tile_req_ptr + tile)
    q_block = tl.load(tile_block_ptr + tile)
    q_row0 = tl.load(query_start_ptr + req)
    chunk = tl.load(query_start_ptr + req + 1) - q_row0
    seq_len = tl.load(seq_lens_ptr + req)
    prefix = seq_len - chunk  # tokens cached before this chunk

    rows = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < chunk
    q_pos = prefix + rows  # [BLOCK_M]
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < HEAD_DIM
    io_mask = row_mask[:, None] & dim_mask[None, :]
    q = tl.load(q_ptr + (q_row0 + rows)[:, None] * stride_q_tok + head * stride_q_head + dims[None, :],
                mask=io_mask, other=0.0)  # [BLOCK_M, BLOCK_D]

    table_row_ptr = block_table_ptr + req * stride_table_req
    kv_head = head // GROUP
    head_offset = kv_head * stride_cache_head
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], SOFTMAX_MIN, dtype=tl.float32)

    # Keys 0 .. first_pos are visible to every row of the tile: whole BLOCK_N tiles of them need no mask.
    first_pos = prefix + q_block * BLOCK_M
    unmasked_end = (first_pos + 1) // BLOCK_N * BLOCK_N
    kv_end = tl.minimum(prefix + (q_block + 1) * BLOCK_M, seq_len)  # one past the last row's position
    for tok0 in range(0, unmasked_end, BLOCK_N):
        toks = tok0 + tl.arange(0, BLOCK_N)
        if FRESH:
            k, v = load_rows_tile(k_ptr, v_ptr, q_row0 + toks, toks < kv_end, kv_head, dims, dim_mask,
                                  stride_k_tok, stride_k_head, stride_v_tok, stride_v_head)
        else:
            k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, table_row_ptr, head_offset, toks, toks < kv_end,
                                dims, dim_mask, stride_cache_page, stride_cache_pos, BLOCK_SIZE)
        k, v = as_compute_dtype(k, v, q)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2e  # [BLOCK_M, BLOCK_N]
        acc, row_sum, row_max = softmax_step(acc, row_sum, row_max, scores, v, DOT_PRECISION)
    for tok0 in range(unmasked_end, kv_end, BLOCK_N):
        toks = tok0 + tl.arange(0, BLOCK_N)
        tok_mask = toks < kv_end
        if FRESH:
            k, v = load_rows_tile(k_ptr, v_ptr, q_row0 + toks, tok_mask, kv_head, dims, dim_mask,
                                  stride_k_tok, stride_k_head, stride_v_tok, stride_v_head)
        else:
            k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, table_row_ptr, head_offset, toks, tok_mask, dims,
                                dim_mask, stride_cache_page, stride_cache_pos, BLOCK_SIZE)
        k, v = as_compute_dtype(k, v, q)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2e
        visible = tok_mask[None, :] & (toks[None, :] <= q_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        acc, row_sum, row_max = softmax_step(acc, row_sum, row_max, scores, v, DOT_PRECISION)

    # Every row sees key 0 (valid rows) or all keys < kv_end (padding rows), so row_sum > 0.
    tl.store(out_ptr + (q_row0 + rows)[:, None] * stride_out_tok + head * stride_out_head + dims[None, :],
             (acc / row_sum[:, None]).to(out_ptr.dtype.element_ty), mask=io_mask)


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                     block_table: torch.Tensor, seq_lens: torch.Tensor, query_start: torch.Tensor,
                     scale: float, work: torch.Tensor, tiles: ExtendTiles,
                     fresh_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Fill out's rows of the requests in `work` (extend_work_list, on q's device, built with
    tiles.block_m). q, out: [T, q_heads, head_dim] with head_dim contiguous. `fresh_kv`: the step's
    own (k, v) [T, kv_heads, head_dim], to read the keys from when no request of `work` has a
    cached prefix (the caller checks; the pages hold the same values in the cache's dtype)."""
    num_tiles = work.shape[1]
    if num_tiles == 0:
        return
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    k, v = fresh_kv if fresh_kv is not None else (k_cache, v_cache)  # unread unless FRESH
    _extend_kernel[(num_q_heads, num_tiles)](
        q, k_cache, v_cache, out, block_table, seq_lens, query_start,
        work[0], work[1], scale * 1.4426950408889634,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0),
        k, v, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        GROUP=num_q_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_D=max(16, next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
        DOT_PRECISION=dot_precision(q.dtype), FRESH=fresh_kv is not None,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
