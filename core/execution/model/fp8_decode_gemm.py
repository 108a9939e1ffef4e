"""The decode path of the block-scaled FP8 linear layer: up to 16 rows of activations times an FP8
weight, on the tensor cores, organised as a stream of the weight.

`decode_gemm(x, x_scales, weight, weight_scale_inv, out_dtype)`: x fp8 [M <= 16, K] with scales
[M, ceil(K/128)] (`fp8_kernels.quantize_activations`), or x in the model's dtype with x_scales None
(each program quantizes its own columns, exactly as `quantize_activations` would); weight fp8
[N, K] with 128 x 128 block scales -> [M, N].

A program owns BLOCK_W weight rows (output columns, inside one weight block row) and GROUPS
consecutive 128-column groups of K: it loads all of its weight (GROUPS tiles of BLOCK_W x 128,
32 KB at the default tiles) before computing anything, then per group one tensor-core dot of the
weight tile with the [128, 16] activation tile, scaled by the block's scale and each token's, added
in float32: what `fp8_format.reference_matmul` defines. Each program's partial sum goes to its own
slot of [K splits, M, N]; a second kernel adds the splits in a fixed order.

Why this shape: at decode the weight read is the whole cost, and a chain of kernels that do nothing
but read the 14B layer's weights, a 32 KB slice a program in one load, reads them at 3.0 TB/s on an
H100 (`python -m benchmarks.launch_overlap`), where cuBLAS's block-scaled GEMM on 16 padded rows
reads at 1.3-2.4 TB/s, and an earlier version of this kernel that walked K in a pipelined loop, a
few large programs per SM, at 1.2-2.6 (benchmarks/NOTES.md, 2026-12-06). Many small programs, each
with all its loads in flight at once, keep the memory system full the way the reading chain does.

Every row count up to 16 runs the same tiles, the same 16-column dot and the same order of
additions, so a request's numbers do not depend on how many others share its decode step (a
batch-1 request and the same request in a batch of 12 compute identical logits).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from core.execution.model.fp8_format import BLOCK, FP8_MAX, MIN_AMAX
from core.execution.model.fp8_kernels import _quantize_rows

DECODE_MAX_M = 16  # the dot's activation columns: every decode step up to this many rows
SUM_BLOCK = 1024  # output columns a program of the split-adding kernel


@triton.jit
def _weight_group(w_rows, step, K, mask_w, GROUP: tl.constexpr, EVEN: tl.constexpr):
    """The [BLOCK_W, GROUP] weight tile of K group `step` (zeros past K)."""
    k = step * GROUP + tl.arange(0, GROUP)
    if EVEN:
        return tl.load(w_rows + k[None, :])
    return tl.load(w_rows + k[None, :], mask=mask_w[:, None] & (k < K)[None, :], other=0.0)


@triton.jit
def _group_product(w, x_ptr, xs_ptr, ws_row, step, M, K, stride_xm, stride_xsm, stride_xsg, stride_wsk,
                   BLOCK_M: tl.constexpr, GROUP: tl.constexpr, QUANTIZE_X: tl.constexpr,
                   FP8_MAX_: tl.constexpr, MIN_AMAX_: tl.constexpr):
    """dot(w, x's group `step` transposed) * x's scales * the weight block's scale: [BLOCK_W, BLOCK_M]."""
    offs_m = tl.arange(0, BLOCK_M)
    k = step * GROUP + tl.arange(0, GROUP)
    mask = (offs_m < M)[:, None] & (k < K)[None, :]  # [BLOCK_M, GROUP]
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :], mask=mask, other=0.0)
    # A group past K (the last program's, where K is ragged) has zero weights and activations; its
    # scales are read at the last group, which keeps every address valid and the product zero.
    scale_step = tl.minimum(step, tl.cdiv(K, GROUP) - 1)
    if QUANTIZE_X:
        values, x_scale = _quantize_rows(x.to(tl.float32), FP8_MAX_, MIN_AMAX_)
        x = values.to(w.dtype)
    else:
        x_scale = tl.load(xs_ptr + offs_m * stride_xsm + scale_step * stride_xsg, mask=offs_m < M, other=0.0)
    w_scale = tl.load(ws_row + scale_step * stride_wsk)
    return tl.dot(w, tl.trans(x)) * (x_scale[None, :] * w_scale)


@triton.jit(do_not_specialize=["M", "stride_xm", "stride_xsm", "stride_ps", "stride_pm"])
def _decode_gemm_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, partial_ptr, M, N, K, stride_xm, stride_xsm, stride_xsg,
                        stride_wn, stride_wsn, stride_wsk, stride_ps, stride_pm,
                        BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr, GROUP: tl.constexpr,
                        GROUPS: tl.constexpr, EVEN: tl.constexpr, QUANTIZE_X: tl.constexpr,
                        FP8_MAX_: tl.constexpr, MIN_AMAX_: tl.constexpr):
    """partial[split, m, n] = the sum over this program's GROUPS groups of K of the scaled products.
    EVEN: N a multiple of BLOCK_W and K of GROUPS * GROUP, so the weight loads need no mask."""
    pid_w = tl.program_id(0)
    split = tl.program_id(1)
    offs_w = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    mask_w = offs_w < N
    w_rows = w_ptr + offs_w[:, None].to(tl.int64) * stride_wn
    ws_row = ws_ptr + ((pid_w * BLOCK_W) // GROUP) * stride_wsn
    first = split * GROUPS
    # Every weight load of the program first: they are all the time there is, and none waits on another.
    w0 = _weight_group(w_rows, first, K, mask_w, GROUP, EVEN)
    if GROUPS >= 2:
        w1 = _weight_group(w_rows, first + 1, K, mask_w, GROUP, EVEN)
    if GROUPS >= 4:
        w2 = _weight_group(w_rows, first + 2, K, mask_w, GROUP, EVEN)
        w3 = _weight_group(w_rows, first + 3, K, mask_w, GROUP, EVEN)
    acc = _group_product(w0, x_ptr, xs_ptr, ws_row, first, M, K, stride_xm, stride_xsm, stride_xsg,
                         stride_wsk, BLOCK_M, GROUP, QUANTIZE_X, FP8_MAX_, MIN_AMAX_)
    if GROUPS >= 2:
        acc += _group_product(w1, x_ptr, xs_ptr, ws_row, first + 1, M, K, stride_xm, stride_xsm, stride_xsg,
                              stride_wsk, BLOCK_M, GROUP, QUANTIZE_X, FP8_MAX_, MIN_AMAX_)
    if GROUPS >= 4:
        acc += _group_product(w2, x_ptr, xs_ptr, ws_row, first + 2, M, K, stride_xm, stride_xsm, stride_xsg,
                              stride_wsk, BLOCK_M, GROUP, QUANTIZE_X, FP8_MAX_, MIN_AMAX_)
        acc += _group_product(w3, x_ptr, xs_ptr, ws_row, first + 3, M, K, stride_xm, stride_xsm, stride_xsg,
                              stride_wsk, BLOCK_M, GROUP, QUANTIZE_X, FP8_MAX_, MIN_AMAX_)
    offs_m = tl.arange(0, BLOCK_M)
    out = partial_ptr + split * stride_ps + offs_m[None, :] * stride_pm + offs_w[:, None]
    tl.store(out, acc.to(partial_ptr.dtype.element_ty), mask=mask_w[:, None] & (offs_m < M)[None, :])


@triton.jit(do_not_specialize=["M", "stride_om"])
def _sum_splits_kernel(partial_ptr, out_ptr, N, SPLITS, stride_ps, stride_pm, stride_om, BLOCK: tl.constexpr):
    """out[m, n] = partial[0, m, n] + partial[1, m, n] + ..., in that order, in float32."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row = tl.program_id(1)
    mask = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in range(SPLITS):
        acc += tl.load(partial_ptr + split * stride_ps + row * stride_pm + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


class DecodeTiles(NamedTuple):
    block_w: int  # weight rows a program; divides 128
    groups: int  # 128-column groups of K a program: 1, 2 or 4
    num_warps: int


DEFAULT_TILES = DecodeTiles(block_w=64, groups=4, num_warps=4)  # 32 KB of weight a program


def decode_gemm(x: torch.Tensor, x_scales: torch.Tensor | None, weight: torch.Tensor,
                weight_scale_inv: torch.Tensor, out_dtype: torch.dtype,
                tiles: DecodeTiles = DEFAULT_TILES) -> torch.Tensor:
    """x fp8 [M, K] with scales [M, ceil(K/128)] (or x unquantized, x_scales None) times the
    block-scaled fp8 weight [N, K] transposed -> [M, N] in out_dtype, for M <= DECODE_MAX_M."""
    m, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and x.stride(1) == 1 and weight.stride(1) == 1
    assert m <= DECODE_MAX_M, f"the decode GEMM takes up to {DECODE_MAX_M} rows, not {m}"
    assert BLOCK % tiles.block_w == 0 and tiles.groups in (1, 2, 4), tiles
    quantize_x = x_scales is None
    if quantize_x:
        x_scales = x.new_empty((0, 0), dtype=torch.float32)  # unused
    splits = triton.cdiv(k, BLOCK * tiles.groups)
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    partials = out[None] if splits == 1 else torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    _decode_gemm_kernel[(triton.cdiv(n, tiles.block_w), splits)](
        x, x_scales, weight, weight_scale_inv, partials, m, n, k, x.stride(0), x_scales.stride(0),
        x_scales.stride(1) if x_scales.dim() == 2 else 1, weight.stride(0), weight_scale_inv.stride(0),
        weight_scale_inv.stride(1), partials.stride(0), partials.stride(1),
        BLOCK_M=DECODE_MAX_M, BLOCK_W=tiles.block_w, GROUP=BLOCK, GROUPS=tiles.groups,
        EVEN=n % tiles.block_w == 0 and k % (BLOCK * tiles.groups) == 0, QUANTIZE_X=quantize_x,
        FP8_MAX_=FP8_MAX, MIN_AMAX_=MIN_AMAX, num_warps=tiles.num_warps)
    if splits > 1:
        _sum_splits_kernel[(triton.cdiv(n, SUM_BLOCK), m)](
            partials, out, n, splits, partials.stride(0), partials.stride(1), out.stride(0), BLOCK=SUM_BLOCK)
    return out

