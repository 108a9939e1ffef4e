"""The decode path of the block-scaled FP8 linear layer on the tensor cores: up to 16 rows of quantized
activations times an FP8 weight, the weight being the dot's rows ("swap AB").

`decode_gemm(x_q, x_scales, weight, weight_scale_inv, out_dtype)`: x_q fp8 [M <= 16, K] with scales
[M, ceil(K/128)] (`fp8_kernels.quantize_activations`), weight fp8 [N, K] with 128 x 128 block
scales -> [M, N]. Each program owns BLOCK_W weight rows (output columns, inside one weight block
row: one weight scale per 128 columns of K) and walks its share of K one 128-column group at a
time, NUM_STAGES groups of weight in flight; per group one tensor-core dot of the [BLOCK_W, 128]
weight tile with the [128, 16] activation tile, scaled by the block's scale and each token's, added
in float32: what `fp8_format.reference_matmul` defines. K split over SPLIT_K programs where the
weight has too few rows to keep every SM streaming; their partial sums are added in a fixed order.

Why: at decode the weight read is the whole cost. The tensor-core GEMM of fp8_kernels.py puts the
tokens on the dot's rows (a 16-row tile, 15 of them padding at batch 1) and the CUDA-core GEMV of
fp8_gemv.py spends its time converting and adding (1.0-1.7 TB/s on the narrow products at one row on
an H100), as cuBLAS's scaled_mm on 16 padded rows does for its own reasons (162 us a layer against
the ~100 us the H100's 3.35 TB/s would allow). Here the tensor cores do the arithmetic and a
program only streams its weight rows.

Every row count up to 16 runs the same tiles and the same 16-column dot, so a request's numbers do
not depend on how many others share its decode step (a batch-1 request and the same request in a
batch of 12 compute identical logits).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from core.execution.model.fp8_format import BLOCK, FP8_MAX, MIN_AMAX
from core.execution.model.fp8_kernels import _quantize_rows, num_sms_of, split_k_partials, sum_split_k

DECODE_MAX_M = 16  # the dot's activation columns: every decode step up to this many rows


@triton.jit(do_not_specialize=["M", "stride_xm", "stride_xsm", "stride_cs", "stride_cm"])
def _decode_gemm_kernel(xq_ptr, xs_ptr, w_ptr, ws_ptr, c_ptr, M, N, K, steps_per_split, stride_xm, stride_xsm,
                        stride_xsg, stride_wn, stride_wsn, stride_wsk, stride_cs, stride_cm,
                        BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr, GROUP: tl.constexpr,
                        EVEN: tl.constexpr, QUANTIZE_X: tl.constexpr, NUM_STAGES: tl.constexpr,
                        FP8_MAX_: tl.constexpr, MIN_AMAX_: tl.constexpr):
    """c[split, m, n] = this split's sum over K of dequantized w[n, k] times dequantized x_q[m, k].
    EVEN: N a multiple of BLOCK_W and K of GROUP, so the weight loads need no mask. QUANTIZE_X: xq
    is the unquantized activations (xs unread), quantized here group by group as
    `quantize_activations` would."""
    pid_w = tl.program_id(0)
    split = tl.program_id(1)
    offs_w = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, GROUP)
    mask_w = offs_w < N
    mask_m = offs_m < M
    ws_row = ws_ptr + ((pid_w * BLOCK_W) // GROUP) * stride_wsn
    acc = tl.zeros((BLOCK_W, BLOCK_M), dtype=tl.float32)
    first_step = split * steps_per_split
    last_step = tl.minimum(first_step + steps_per_split, tl.cdiv(K, GROUP))
    for step in tl.range(first_step, last_step, num_stages=NUM_STAGES):
        k = step * GROUP + offs_k
        w_ptrs = w_ptr + offs_w[:, None] * stride_wn + k[None, :]
        if EVEN:
            w = tl.load(w_ptrs)  # [BLOCK_W, GROUP]
        else:
            w = tl.load(w_ptrs, mask=mask_w[:, None] & (k < K)[None, :], other=0.0)
        if QUANTIZE_X:
            rows = tl.load(xq_ptr + offs_m[:, None] * stride_xm + k[None, :],
                           mask=mask_m[:, None] & (k < K)[None, :], other=0.0)  # [BLOCK_M, GROUP]
            x, x_scale = _quantize_rows(rows.to(tl.float32), FP8_MAX_, MIN_AMAX_)
            x = tl.trans(x.to(w.dtype))
        else:
            x = tl.load(xq_ptr + offs_m[None, :] * stride_xm + k[:, None],
                        mask=(k < K)[:, None] & mask_m[None, :], other=0.0)  # [GROUP, BLOCK_M]
            x_scale = tl.load(xs_ptr + offs_m * stride_xsm + step * stride_xsg, mask=mask_m, other=0.0)
        w_scale = tl.load(ws_row + step * stride_wsk)
        acc += tl.dot(w, x) * (x_scale[None, :] * w_scale)
    c = c_ptr + split * stride_cs + offs_m[None, :] * stride_cm + offs_w[:, None]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=mask_w[:, None] & mask_m[None, :])


class DecodeTiles(NamedTuple):
    block_w: int  # weight rows a program; divides 128
    split_k: int
    num_stages: int
    num_warps: int


def decode_tiles(n: int, k: int, num_sms: int = 132) -> DecodeTiles:
    """Tiles for an [N, K] weight, the same for every row count (see the module's last paragraph).
    A first guess, to be replaced by what `python -m benchmarks.fp8_tiles` measures: 32 weight rows
    a program, K split until there are two programs an SM, four groups of weight in flight."""
    block_w = 32
    steps = triton.cdiv(k, BLOCK)
    split_k = 1
    while triton.cdiv(n, block_w) * split_k < 2 * num_sms and steps // (split_k * 2) >= 8:
        split_k *= 2
    return DecodeTiles(block_w, split_k, num_stages=4, num_warps=4)


def decode_gemm(x_q: torch.Tensor, x_scales: torch.Tensor | None, weight: torch.Tensor,
                weight_scale_inv: torch.Tensor, out_dtype: torch.dtype,
                tiles: DecodeTiles | None = None) -> torch.Tensor:
    """x_q fp8 [M, K] with scales [M, ceil(K/128)] times the block-scaled fp8 weight [N, K]
    transposed -> [M, N] in out_dtype, for M <= DECODE_MAX_M. x_scales None: x_q is the
    unquantized activations, which every program quantizes as `quantize_activations` would (one
    launch instead of two; every program of a column quantizes the rows again)."""
    m, k = x_q.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and x_q.stride(1) == 1 and weight.stride(1) == 1
    assert m <= DECODE_MAX_M, f"the decode GEMM takes up to {DECODE_MAX_M} rows, not {m}"
    if tiles is None:
        tiles = decode_tiles(n, k, num_sms_of(x_q.device))
    assert BLOCK % tiles.block_w == 0, tiles
    steps = triton.cdiv(k, BLOCK)
    steps_per_split = triton.cdiv(steps, tiles.split_k)
    split_k = triton.cdiv(steps, steps_per_split)
    partials = split_k_partials(m, n, split_k, out_dtype, x_q.device)
    grid = (triton.cdiv(n, tiles.block_w), split_k)
    quantize_x = x_scales is None
    if quantize_x:
        x_scales = weight_scale_inv  # unread
    _decode_gemm_kernel[grid](
        x_q, x_scales, weight, weight_scale_inv, partials, m, n, k, steps_per_split, x_q.stride(0),
        x_scales.stride(0), x_scales.stride(1), weight.stride(0), weight_scale_inv.stride(0),
        weight_scale_inv.stride(1), partials.stride(0), partials.stride(1),
        BLOCK_M=DECODE_MAX_M, BLOCK_W=tiles.block_w, GROUP=BLOCK,
        EVEN=n % tiles.block_w == 0 and k % BLOCK == 0, QUANTIZE_X=quantize_x, NUM_STAGES=tiles.num_stages,
        FP8_MAX_=FP8_MAX, MIN_AMAX_=MIN_AMAX, num_warps=tiles.num_warps)
    return sum_split_k(partials, out_dtype)
