"""The decode path of the block-scaled FP8 linear layer for steps of 2-4 rows where cuBLAS's
block-scaled GEMM is not available (fp8_gemm.triton_gemm): a few rows of quantized activations
times an FP8 weight, on the CUDA cores, streaming the weight once.

`fp8_gemv(x_q, x_scales, weight, weight_scale_inv, out_dtype)`: x_q fp8 [M, K] with scales
[M, ceil(K/128)] (`fp8_kernels.quantize_activations`), weight fp8 [N, K] with 128 x 128 block scales
-> [M, N]. Each program owns BLOCK_N output columns (inside one weight block row, so one weight
scale per 128 columns of K) and walks K one 128-column group at a time, software-pipelined
(NUM_STAGES groups of weight in flight). Per group it multiplies element by element in float32,
scales by the token's and the block's scale, and adds into a [BLOCK_M, BLOCK_N, 128] accumulator
that it sums over K once after the loop: the definition `fp8_format.reference_matmul` computes, in
another order.

Why not the tensor-core GEMM of fp8_kernels.py at batch 1: a tensor-core tile has at least 16 rows,
15 of them padding, and the GEMM's K loop holds one 128-column step in flight; it made the FP8
decode step twice as slow as bf16 on an H100. Measured there per layer of Qwen3-14B at one row
(`python -m benchmarks.fp8_tiles`, docs/reports/h100/fp8): this kernel 171 us (168 with each
shape's best tiles), a first GEMV that quantized inside its loop and summed across threads every
step 265 us, cuBLAS's scaled_mm on 16 padded rows 162 us, bf16 246 us (benchmarks/NOTES.md).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from core.execution.model.fp8_format import BLOCK
from core.execution.model.fp8_kernels import num_sms_of, split_k_partials, sum_split_k

# Up to this many rows the GEMV serves (fp8_gemm.triton_gemm; one row takes the faster row GEMV of
# fp8_row_gemv.py); above, the tensor-core GEMM. Measured on an H100: per layer 265 us against the
# tensor-core GEMM's 520 at 4 rows, 466 against 396 at 8.
GEMV_MAX_M = 4


@triton.jit(do_not_specialize=["M", "steps_per_split", "stride_xm", "stride_xsm", "stride_cs", "stride_cm"])
def _fp8_gemv_kernel(xq_ptr, xs_ptr, w_ptr, ws_ptr, c_ptr, M, N, K, steps_per_split, stride_xm, stride_xsm,
                     stride_xsg, stride_wn, stride_wsn, stride_wsk, stride_cs, stride_cm,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr,
                     NUM_STAGES: tl.constexpr):
    """c[split, m, n] = this split's sum over K of dequantized x_q[m, k] times dequantized w[n, k]."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, GROUP)
    mask_m = offs_m < M
    mask_n = offs_n < N
    ws_row = ws_ptr + ((pid_n * BLOCK_N) // GROUP) * stride_wsn
    products = tl.zeros((BLOCK_M, BLOCK_N, GROUP), dtype=tl.float32)
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
        products += (x * (x_scale[:, None] * w_scale))[:, None, :] * w[None, :, :]
    acc = tl.sum(products, axis=2)
    c = c_ptr + split * stride_cs + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


class GemvTiles(NamedTuple):
    block_n: int  # divides 128
    split_k: int
    num_stages: int
    num_warps: int


def gemv_tiles(m: int, n: int, k: int, num_sms: int = 132) -> GemvTiles:
    """The tiles that measured best on an H100 for Qwen3-14B's four products at 1, 2 and 4 rows:
    32 columns a program where that still leaves 8 programs an SM (the gate/up product), else 8
    at one row and 16 above; K split in two where it is at least twice N (the down product, whose
    5,120 columns alone leave SMs idle); 3 stages (within 8 % of the best everywhere)."""
    if m <= 2 and triton.cdiv(n, 32) >= 8 * num_sms:
        block_n = 32
    else:
        block_n = 8 if m == 1 else 16
    return GemvTiles(block_n, split_k=2 if k >= 2 * n else 1, num_stages=3, num_warps=4)


def fp8_gemv(x_q: torch.Tensor, x_scales: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
             out_dtype: torch.dtype, tiles: GemvTiles | None = None) -> torch.Tensor:
    """x_q fp8 [M, K] with scales [M, ceil(K/128)] times the block-scaled fp8 weight [N, K]
    transposed -> [M, N] in out_dtype."""
    m, k = x_q.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and x_q.stride(1) == 1 and weight.stride(1) == 1
    assert m <= 16, f"the GEMV holds all {m} rows in one program: it is for decode's few"
    if tiles is None:
        tiles = gemv_tiles(m, n, k, num_sms_of(x_q.device))
    assert BLOCK % tiles.block_n == 0, tiles
    steps = triton.cdiv(k, BLOCK)
    steps_per_split = triton.cdiv(steps, tiles.split_k)
    split_k = triton.cdiv(steps, steps_per_split)
    partials = split_k_partials(m, n, split_k, out_dtype, x_q.device)
    grid = (triton.cdiv(n, tiles.block_n), split_k)
    _fp8_gemv_kernel[grid](
        x_q, x_scales, weight, weight_scale_inv, partials, m, n, k, steps_per_split, x_q.stride(0),
        x_scales.stride(0), x_scales.stride(1), weight.stride(0), weight_scale_inv.stride(0),
        weight_scale_inv.stride(1), partials.stride(0), partials.stride(1),
        BLOCK_M=triton.next_power_of_2(max(m, 1)), BLOCK_N=tiles.block_n, GROUP=BLOCK,
        NUM_STAGES=tiles.num_stages, num_warps=tiles.num_warps)
    return sum_split_k(partials, out_dtype)
