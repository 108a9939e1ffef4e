"""Writing a step's new K and V rows into their pages, both in one Triton launch.

Called by TritonAttention.forward before attention reads the pages. Same contract as
`core.execution.attention.backend.write_kv` (two torch index_copy_ calls): token t's rows go to
kv_index[t] = page * block_size + offset. A negative slot means "write nothing" (padding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.execution.attention.triton_tiles import next_power_of_2
from core.execution.dependent_launch import dependent_launch, gdc_launch_dependents, gdc_wait, launch_options
from core.execution.kv_cache import FP8_KV_DTYPE, FP8_KV_MAX
from core.execution.model.fp8_kernels import round_to_e4m3


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, kv_index_ptr,
    stride_k_tok, stride_k_head, stride_v_tok, stride_v_head,
    stride_cache_page, stride_cache_pos, stride_cache_head,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, FP8_CACHE: tl.constexpr, FP8_MAX_: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:  # core/execution/dependent_launch.py
        gdc_launch_dependents()
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(kv_index_ptr + tok)  # the step's slots: no kernel of the forward writes them
    if PDL:
        gdc_wait()
    if slot < 0:
        return
    page = slot // BLOCK_SIZE
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    mask = (heads < NUM_KV_HEADS)[:, None] & (dims < HEAD_DIM)[None, :]
    dst = page * stride_cache_page + (slot % BLOCK_SIZE) * stride_cache_pos
    dst_offsets = dst + heads[:, None] * stride_cache_head + dims[None, :]  # [BLOCK_H, BLOCK_D]
    k = tl.load(k_ptr + tok * stride_k_tok + heads[:, None] * stride_k_head + dims[None, :], mask=mask)
    v = tl.load(v_ptr + tok * stride_v_tok + heads[:, None] * stride_v_head + dims[None, :], mask=mask)
    if FP8_CACHE:  # saturate, then round to nearest e4m3 (the cast is then exact; see fp8_kernels)
        k = round_to_e4m3(tl.minimum(tl.maximum(k.to(tl.float32), -FP8_MAX_), FP8_MAX_))
        v = round_to_e4m3(tl.minimum(tl.maximum(v.to(tl.float32), -FP8_MAX_), FP8_MAX_))
    tl.store(k_cache_ptr + dst_offsets, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst_offsets, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_paged(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   kv_index: torch.Tensor) -> None:
    """k, v: [T, kv_heads, head_dim] (any row strides); caches [num_pages, block_size, kv_heads, head_dim]."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError(f"K and V caches need equal strides with head_dim contiguous, got "
                         f"{k_cache.stride()} and {v_cache.stride()}")
    block_h, block_d = next_power_of_2(num_kv_heads), next_power_of_2(head_dim)
    pdl = dependent_launch(k.device)
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, kv_index,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_D=block_d,
        BLOCK_SIZE=k_cache.shape[1], FP8_CACHE=k_cache.dtype == FP8_KV_DTYPE, FP8_MAX_=FP8_KV_MAX,
        PDL=pdl, **launch_options(pdl),
        # One token's K and V for 8 heads x 128 dims is 2 x 2 KiB in bf16: 16-byte accesses on 4 warps.
        num_warps=4 if block_h * block_d >= 1024 else 1,
    )
