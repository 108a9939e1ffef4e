"""Paged decode attention in Triton: split-KV (flash-decoding) with GQA packing.

Called by TritonAttention for the requests of a step whose query length is exactly 1 (the others
exit at once). Decode reads every K/V byte of the context once per step and does little arithmetic,
so the kernel is shaped for memory bandwidth:

* GQA packing: one program serves all `group` query heads of a KV head (padded to 16 rows, the
  smallest tensor-core tile), so each K/V page is read once per KV head, not once per query head.
* Split-KV: a request's context is cut into `num_splits` chunks of `split_tokens` tokens, each its
  own program, so that a small batch still fills every SM. Each split writes its normalised partial
  output and log-sum-exp; `_decode_reduce_kernel` combines them. With one split the first kernel
  writes the output directly and the reduce is skipped.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from core.execution.attention.triton_tiles import (
    SOFTMAX_MIN,
    as_compute_dtype,
    dot_precision,
    load_kv_tile,
    next_power_of_2,
    softmax_step,
)
from core.execution.dependent_launch import dependent_launch, gdc_launch_dependents, gdc_wait, launch_options

# Enough programs for several waves of resident blocks, so that the last wave's tail is short; a
# step with fewer (request, KV head) pairs than this splits each context.
PROGRAMS_PER_SM = 8
# A split shorter than this spends more on its setup and partial result than it saves. The partial
# result costs little: q_heads x head_dim x 8 bytes per split, ~0.5 % of a 2,048-token context's K/V.
MIN_SPLIT_TOKENS = 128
MAX_SPLITS = 64


class DecodeTiles(NamedTuple):
    block_n: int  # context tokens per loop iteration
    num_warps: int
    num_stages: int


class DecodeSplits(NamedTuple):
    num_splits: int
    # A multiple of DecodeTiles.block_n; 0: each request's context is cut into num_splits equal
    # parts, computed in the kernel from its seq_len (launches that must not depend on this step's
    # lengths: CUDA graphs).
    split_tokens: int


def decode_tiles(dtype: torch.dtype) -> DecodeTiles:
    if dtype == torch.float32:
        # float32 multiplies on the CUDA cores ("ieee"); 8 warps hold the tile without spills (sm_90).
        return DecodeTiles(block_n=32, num_warps=8, num_stages=2)
    # 64 tokens x 128 dims of K and of V in bf16 is 32 KiB per tile; compiled for sm_90 this takes
    # 38 KiB of shared memory and 80 registers per thread: five programs fit on one SM.
    return DecodeTiles(block_n=64, num_warps=4, num_stages=2)


def plan_splits(num_decodes: int, num_kv_heads: int, max_seq_len: int, num_sms: int, block_n: int,
                min_split_tokens: int = MIN_SPLIT_TOKENS) -> DecodeSplits:
    """Enough splits to give every SM PROGRAMS_PER_SM programs, none shorter than min_split_tokens."""
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, max(1, num_decodes * num_kv_heads))
    by_length = max(1, max_seq_len // min_split_tokens)
    num_splits = max(1, min(wanted, by_length, MAX_SPLITS))
    split_tokens = triton.cdiv(triton.cdiv(max(1, max_seq_len), num_splits), block_n) * block_n
    return DecodeSplits(triton.cdiv(max(1, max_seq_len), split_tokens), split_tokens)


# Integers that change from step to step are not specialized on (Triton would compile a variant for
# each of: equal to 1, a multiple of 16, neither), so the runner's warm-up compiles every variant.
@triton.jit(do_not_specialize=["num_splits", "stride_table_req"])
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, partial_out_ptr, partial_lse_ptr,
    block_table_ptr, seq_lens_ptr, query_start_ptr,
    scale_log2e, num_splits, split_tokens,
    stride_q_tok, stride_q_head, stride_out_tok, stride_out_head,
    stride_cache_page, stride_cache_pos, stride_cache_head, stride_table_req,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PER_REQUEST_SPLITS: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:  # core/execution/dependent_launch.py
        gdc_launch_dependents()
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # The step's metadata, which no kernel of the forward writes, before the wait.
    q_row = tl.load(query_start_ptr + req)
    q_end = tl.load(query_start_ptr + req + 1)
    seq_len = tl.load(seq_lens_ptr + req)
    if PDL:
        gdc_wait()
    if q_end - q_row != 1:
        return
    if PER_REQUEST_SPLITS:
        split_tokens = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    kv_start = split * split_tokens
    if kv_start >= seq_len:
        return
    kv_end = tl.minimum(kv_start + split_tokens, seq_len)

    group_rows = tl.arange(0, BLOCK_H)
    heads = kv_head * GROUP + group_rows  # the query heads reading this KV head
    head_mask = group_rows < GROUP
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < HEAD_DIM
    io_mask = head_mask[:, None] & dim_mask[None, :]
    q = tl.load(q_ptr + q_row * stride_q_tok + heads[:, None] * stride_q_head + dims[None, :],
                mask=io_mask, other=0.0)  # [BLOCK_H, BLOCK_D]

    table_row_ptr = block_table_ptr + req * stride_table_req
    head_offset = kv_head * stride_cache_head
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
    row_max = tl.full([BLOCK_H], SOFTMAX_MIN, dtype=tl.float32)
    for tok0 in range(kv_start, kv_end, BLOCK_N):
        toks = tok0 + tl.arange(0, BLOCK_N)
        tok_mask = toks < kv_end
        k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, table_row_ptr, head_offset, toks, tok_mask, dims,
                            dim_mask, stride_cache_page, stride_cache_pos, BLOCK_SIZE)
        k, v = as_compute_dtype(k, v, q)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2e  # [BLOCK_H, BLOCK_N]
        scores = tl.where(tok_mask[None, :], scores, float("-inf"))
        acc, row_sum, row_max = softmax_step(acc, row_sum, row_max, scores, v, DOT_PRECISION)

    # Every split holds at least one token, so row_sum >= 1.
    if DIRECT:
        tl.store(out_ptr + q_row * stride_out_tok + heads[:, None] * stride_out_head + dims[None, :],
                 (acc / row_sum[:, None]).to(out_ptr.dtype.element_ty), mask=io_mask)
    else:
        # partial_out: [B, q_heads, num_splits, HEAD_DIM]; partial_lse: [B, q_heads, num_splits], log2 units.
        part = (req * (tl.num_programs(1) * GROUP) + heads) * num_splits + split  # [BLOCK_H]
        tl.store(partial_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc / row_sum[:, None],
                 mask=io_mask)
        tl.store(partial_lse_ptr + part, row_max + tl.log2(row_sum), mask=head_mask)


@triton.jit(do_not_specialize=["num_splits"])
def _decode_reduce_kernel(
    partial_out_ptr, partial_lse_ptr, out_ptr, seq_lens_ptr, query_start_ptr,
    num_splits, split_tokens, stride_out_tok, stride_out_head,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr,
    PER_REQUEST_SPLITS: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:  # core/execution/dependent_launch.py
        gdc_launch_dependents()
    req = tl.program_id(0)
    head = tl.program_id(1)
    q_row = tl.load(query_start_ptr + req)
    q_end = tl.load(query_start_ptr + req + 1)
    seq_len = tl.load(seq_lens_ptr + req)
    if PDL:
        gdc_wait()
    if q_end - q_row != 1:
        return
    if PER_REQUEST_SPLITS:
        split_tokens = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    # Splits past the end of this request's context were never written.
    used = tl.cdiv(seq_len, split_tokens)
    splits = tl.arange(0, BLOCK_S)
    split_mask = splits < used
    part = (req * tl.num_programs(1) + head) * num_splits + splits  # [BLOCK_S]
    lse = tl.load(partial_lse_ptr + part, mask=split_mask, other=float("-inf"))
    weights = tl.exp2(lse - tl.max(lse, 0))
    weights = weights / tl.sum(weights, 0)
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < HEAD_DIM
    parts = tl.load(partial_out_ptr + part[:, None] * HEAD_DIM + dims[None, :],
                    mask=split_mask[:, None] & dim_mask[None, :], other=0.0)  # [BLOCK_S, BLOCK_D]
    out = tl.sum(parts * weights[:, None], 0)
    tl.store(out_ptr + q_row * stride_out_tok + head * stride_out_head + dims,
             out.to(out_ptr.dtype.element_ty), mask=dim_mask)


def reduce_block(num_splits: int) -> int:
    """Splits the reduce kernel reads at once: three sizes (16, 32, 64), so three compiled variants."""
    return max(16, next_power_of_2(num_splits))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                     block_table: torch.Tensor, seq_lens: torch.Tensor, query_start: torch.Tensor,
                     scale: float, splits: DecodeSplits, partial_out: torch.Tensor | None,
                     partial_lse: torch.Tensor | None, tiles: DecodeTiles | None = None) -> None:
    """Fill out's rows of the requests with query length 1; other rows are left alone.

    q, out: [T, q_heads, head_dim] with head_dim contiguous. With splits.num_splits > 1,
    partial_out [B, q_heads, num_splits, head_dim] and partial_lse [B, q_heads, num_splits] are
    float32 scratch. `tiles` overrides decode_tiles (benchmarks sweep it); splits.split_tokens must
    be a multiple of its block_n.
    """
    num_reqs = seq_lens.shape[0]
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_q_heads // num_kv_heads
    tiles = tiles or decode_tiles(q.dtype)
    direct = splits.num_splits == 1
    per_request = splits.split_tokens == 0
    block_d = max(16, next_power_of_2(head_dim))
    pdl = dependent_launch(q.device)
    _decode_split_kernel[(num_reqs, num_kv_heads, splits.num_splits)](
        q, k_cache, v_cache, out, partial_out, partial_lse,
        block_table, seq_lens, query_start,
        scale * 1.4426950408889634, splits.num_splits, splits.split_tokens,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0),
        GROUP=group, BLOCK_H=max(16, next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_SIZE=block_size, BLOCK_N=tiles.block_n, DIRECT=direct,
        DOT_PRECISION=dot_precision(q.dtype), PER_REQUEST_SPLITS=per_request, PDL=pdl, **launch_options(pdl),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    if direct:
        return
    _decode_reduce_kernel[(num_reqs, num_q_heads)](
        partial_out, partial_lse, out, seq_lens, query_start,
        splits.num_splits, splits.split_tokens, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=reduce_block(splits.num_splits),
        BLOCK_N=tiles.block_n, PER_REQUEST_SPLITS=per_request, PDL=pdl, **launch_options(pdl), num_warps=4,
    )
