"""The decode path of the block-scaled FP8 linear layer: a few rows of activations times an FP8 weight,
on the CUDA cores, streaming the weight once at close to the memory bandwidth.

`fp8_gemv(x, weight, weight_scale_inv, out_dtype)`: x [M, K] unquantized (M small: decode), weight
fp8 [N, K] with 128 x 128 block scales -> [M, N]. Each program owns BLOCK_N output columns (inside
one weight block row, so one weight scale per 128 columns of K) and walks K in steps of BLOCK_K:
it loads the weight tile once, quantizes the activations' 1 x 128 groups exactly as
`fp8_kernels.quantize_activations` does, and adds sum_k x_q[m, k] * x_scale[m, g] * w_scale[g] *
w[n, k] in float32 — the definition `fp8_format.reference_matmul` computes, in another order.

Why not the tensor-core GEMM of fp8_kernels.py at batch 1: a tensor-core tile has at least 16 rows,
so 15 of 16 are padding, and the GEMM's K loop holds one 128-column step in flight; measured on
an H100 it made the FP8 decode step twice as slow as bf16 (docs/reports, benchmarks/NOTES.md). A
decode step is a weight read: what matters is many bytes in flight, hence wide K steps and narrow
column tiles, enough programs to fill every SM without splitting K (no partial sums to add).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from core.execution.model.fp8_format import BLOCK, FP8_MAX, MIN_AMAX
from core.execution.model.fp8_kernels import _num_sms, _quantize_rows, split_k_partials, sum_split_k

# Up to this many rows the GEMV serves (fp8_gemm.triton_gemm); above, the tensor-core GEMM. Measured
# on an H100 (benchmarks.fp8_tiles): ahead of the fused tensor-core GEMM at 1 and 2 rows, behind from 4.
GEMV_MAX_M = 2


@triton.jit(do_not_specialize=["M", "steps_per_split", "stride_xm", "stride_cs", "stride_cm"])
def _fp8_gemv_kernel(x_ptr, w_ptr, ws_ptr, c_ptr, M, N, K, steps_per_split, stride_xm, stride_wn,
                     stride_wsn, stride_wsk, stride_cs, stride_cm,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP: tl.constexpr, FP8_MAX_: tl.constexpr, MIN_AMAX_: tl.constexpr):
    """c[split, m, n] = this split's sum over K of dequantized x_q[m, k] times dequantized w[n, k]."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    ws_row = ws_ptr + ((pid_n * BLOCK_N) // GROUP) * stride_wsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first_step = split * steps_per_split
    last_step = tl.minimum(first_step + steps_per_split, tl.cdiv(K, BLOCK_K))
    for step in range(first_step, last_step):
        k = step * BLOCK_K + offs_k
        mask_k = k < K
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                    other=0.0).to(tl.float32)  # [BLOCK_N, BLOCK_K]
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_K]
        groups = tl.reshape(x, (BLOCK_M * (BLOCK_K // GROUP), GROUP))
        x_q, x_scale = _quantize_rows(groups, FP8_MAX_, MIN_AMAX_)
        w_scale = tl.load(ws_row + (step * (BLOCK_K // GROUP) + tl.arange(0, BLOCK_K // GROUP)) * stride_wsk,
                          mask=(step * BLOCK_K + tl.arange(0, BLOCK_K // GROUP) * GROUP) < K, other=0.0)
        group_scale = tl.reshape(x_scale, (BLOCK_M, BLOCK_K // GROUP)) * w_scale[None, :]
        x_d = tl.reshape(x_q, (BLOCK_M, BLOCK_K // GROUP, GROUP)) * group_scale[:, :, None]
        x_d = tl.reshape(x_d, (BLOCK_M, BLOCK_K))
        acc += tl.sum(x_d[:, None, :] * w[None, :, :], axis=2)
    c = c_ptr + split * stride_cs + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit(do_not_specialize=["M", "steps_per_split", "stride_xm", "stride_xsm", "stride_cs", "stride_cm"])
def _fp8_gemv_prequantized_kernel(xq_ptr, xs_ptr, w_ptr, ws_ptr, c_ptr, M, N, K, steps_per_split, stride_xm,
                                  stride_xsm, stride_xsg, stride_wn, stride_wsn, stride_wsk, stride_cs,
                                  stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                  GROUP: tl.constexpr, NUM_STAGES: tl.constexpr, DEFER_SUM: tl.constexpr):
    """As _fp8_gemv_kernel, on activations quantized beforehand (`quantize_activations`): per
    128-column group one fp8 x fp8 product summed in float32, scaled by the token's and the
    block's scale; the group loop is software-pipelined (NUM_STAGES groups of weight in flight).
    DEFER_SUM: the scaled products are added element by element into a [BLOCK_M, BLOCK_N, 128]
    accumulator and summed over K once after the loop, not once a step across the threads."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, GROUP)
    mask_m = offs_m < M
    mask_n = offs_n < N
    ws_row = ws_ptr + ((pid_n * BLOCK_N) // GROUP) * stride_wsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    products = tl.zeros((BLOCK_M, BLOCK_N, GROUP), dtype=tl.float32)  # DEFER_SUM's accumulator
    first_step = split * steps_per_split
    last_step = tl.minimum(first_step + steps_per_split, tl.cdiv(K, GROUP))
    for step in tl.range(first_step, last_step, num_stages=NUM_STAGES):
        k = step * GROUP + offs_k
        mask_k = k < K
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                    other=0.0).to(tl.float32)  # [BLOCK_N, GROUP]
        x = tl.load(xq_ptr + offs_m[:, None] * stride_xm + k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0).to(tl.float32)  # [BLOCK_M, GROUP]
        x_scale = tl.load(xs_ptr + offs_m * stride_xsm + step * stride_xsg, mask=mask_m, other=0.0)
        w_scale = tl.load(ws_row + step * stride_wsk)
        if DEFER_SUM:
            products += (x * (x_scale[:, None] * w_scale))[:, None, :] * w[None, :, :]
        else:
            acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2) * (x_scale[:, None] * w_scale)
    if DEFER_SUM:
        acc = tl.sum(products, axis=2)
    c = c_ptr + split * stride_cs + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


class GemvTiles(NamedTuple):
    block_m: int  # rows per program: a power of two >= M up to GEMV_MAX_M
    block_n: int  # divides 128
    block_k: int  # a multiple of 128
    split_k: int
    num_warps: int


def gemv_tiles(m: int, n: int, k: int, num_sms: int = 132) -> GemvTiles:
    """A first guess: narrow column tiles and K steps of up to 512 columns (8 KB of weight per load at
    BLOCK_N 16; the [BLOCK_M, BLOCK_N, BLOCK_K] product held at most 16 K values, 128 a thread),
    K split only where the column tiles alone leave SMs idle."""
    block_m = triton.next_power_of_2(max(m, 1))
    block_n = 16 if block_m <= 2 else 8
    block_k = min(512, 16384 // (block_m * block_n))
    split_k = 1
    k_steps = triton.cdiv(k, block_k)
    while triton.cdiv(n, block_n) * split_k < 2 * num_sms and split_k * 2 <= k_steps // 4:
        split_k *= 2
    return GemvTiles(block_m, block_n, block_k, split_k, num_warps=4)


def fp8_gemv(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor, out_dtype: torch.dtype,
             tiles: GemvTiles | None = None) -> torch.Tensor:
    """x [M, K] (unquantized) times the block-scaled fp8 weight [N, K] transposed -> [M, N] in out_dtype."""
    m, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and x.stride(1) == 1 and weight.stride(1) == 1
    if tiles is None:
        tiles = gemv_tiles(m, n, k, _num_sms(x.device))
    assert BLOCK % tiles.block_n == 0 and tiles.block_k % BLOCK == 0, tiles
    k_steps = triton.cdiv(k, tiles.block_k)
    steps_per_split = triton.cdiv(k_steps, tiles.split_k)
    split_k = triton.cdiv(k_steps, steps_per_split)
    partials = split_k_partials(m, n, split_k, out_dtype, x.device)
    grid = (triton.cdiv(n, tiles.block_n), split_k, triton.cdiv(m, tiles.block_m))
    _fp8_gemv_kernel[grid](x, weight, weight_scale_inv, partials, m, n, k, steps_per_split, x.stride(0),
                           weight.stride(0), weight_scale_inv.stride(0), weight_scale_inv.stride(1),
                           partials.stride(0), partials.stride(1), BLOCK_M=tiles.block_m,
                           BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP=BLOCK, FP8_MAX_=FP8_MAX,
                           MIN_AMAX_=MIN_AMAX, num_warps=tiles.num_warps)
    return sum_split_k(partials, out_dtype)


def fp8_gemv_prequantized(x_q: torch.Tensor, x_scales: torch.Tensor, weight: torch.Tensor,
                          weight_scale_inv: torch.Tensor, out_dtype: torch.dtype, block_n: int = 16,
                          split_k: int = 1, num_stages: int = 4, num_warps: int = 4,
                          defer_sum: bool = False) -> torch.Tensor:
    """x_q fp8 [M, K] with scales [M, ceil(K/128)] (`quantize_activations`) times the block-scaled fp8
    weight [N, K] transposed -> [M, N] in out_dtype: the GEMV with the quantization taken out of its
    loop, a candidate for decode that `python -m benchmarks.fp8_tiles` times against `fp8_gemv`."""
    m, k = x_q.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and x_q.stride(1) == 1 and weight.stride(1) == 1 and BLOCK % block_n == 0
    steps = triton.cdiv(k, BLOCK)
    steps_per_split = triton.cdiv(steps, split_k)
    split_k = triton.cdiv(steps, steps_per_split)
    partials = split_k_partials(m, n, split_k, out_dtype, x_q.device)
    block_m = triton.next_power_of_2(max(m, 1))
    grid = (triton.cdiv(n, block_n), split_k, 1)
    _fp8_gemv_prequantized_kernel[grid](
        x_q, x_scales, weight, weight_scale_inv, partials, m, n, k, steps_per_split, x_q.stride(0),
        x_scales.stride(0), x_scales.stride(1), weight.stride(0), weight_scale_inv.stride(0),
        weight_scale_inv.stride(1), partials.stride(0), partials.stride(1), BLOCK_M=block_m, BLOCK_N=block_n,
        GROUP=BLOCK, NUM_STAGES=num_stages, DEFER_SUM=defer_sum, num_warps=num_warps)
    return sum_split_k(partials, out_dtype)
