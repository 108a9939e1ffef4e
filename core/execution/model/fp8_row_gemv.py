"""A decode GEMV for block-scaled FP8 weights shaped like a plain read of the weight: each program
owns a few whole weight rows, issues the loads of all of them at once, then multiplies on the CUDA
cores. No K split, so no partial sums and no second kernel.

`fp8_row_gemv(x_q, x_scales, weight, weight_scale_inv, out_dtype)`: x_q fp8 [M, K] with scales
[M, ceil(K/128)] (`fp8_kernels.quantize_activations`), weight fp8 [N, K] with 128 x 128 block scales
-> [M, N], for decode's few rows. A program takes `tokens` tokens and `rows` weight rows (inside one
128-row block, so one row of weight scales) and walks K in `chunk`-column pieces, unrolled (K is
a compile-time constant), so that the compiler can issue every piece's load before the first multiply. Per
128-column group it sums x_q * w in float32, scales the sum by the token's and the block's scale,
and adds the groups in order: the definition `fp8_format.reference_matmul` computes, in another
order. Each token goes through the same operations, one after the other on the piece of weight the
program holds, so a token's arithmetic is the same whatever the step's row count (a first version
held all of a step's tokens in one 4-D product: a row alone then differed from itself in a step of
2-4 in the last bits, and 2-4 rows ran 3-20x slower than one; one token a program reads the weight
once per token, 175 us a layer at two rows against cuBLAS's 164). Several tokens a program
(`tokens`) read each weight row once for all of them, but measured no faster (H100, `python -m
benchmarks.fp8_tiles --batches 1,2,4,8 --only 'row gemv'`: 175 us a layer at two rows and 290 at
four against cuBLAS's 158 and 156), so steps of more than one row stay on cuBLAS and the option is
left to fp8_tiles' candidates.

Why: a CUDA graph of kernels that only read the 14B layer's FP8 weights, 32 KB a program in one
load, reads them at 3.0 TB/s on an H100 (benchmarks/launch_overlap.py), where cuBLAS's block-scaled
GEMM and the earlier GEMVs (fp8_gemv.py: one 128-column group of 8-32 rows a step, a few steps in
flight) take its products at 1.3-2.5 TB/s at one row. This kernel keeps the read's shape and does
the arithmetic on registers, with no shared-memory staging for tensor cores (what the tensor-core
decode GEMMs measured slower with, benchmarks/NOTES.md).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from core.execution.dependent_launch import dependent_launch, gdc_launch_dependents, gdc_wait, launch_options
from core.execution.model.fp8_format import BLOCK

# Measured on an H100, a layer of Qwen3-14B takes 119 us at one row against cuBLAS's 164, but 175
# against 164 at two rows and 290 against 164 at four, one token a program or several (the module
# docstring). So the row GEMV serves steps of one row.
ROW_GEMV_MAX_M = 1


class RowGemvTiles(NamedTuple):
    rows: int  # weight rows a program owns: a power of two dividing 128
    chunk: int  # columns of K a piece: a power-of-two multiple of 128
    num_warps: int
    # The step's tokens a program multiplies by its weight rows, which it reads once for them all: a
    # power of two. Each token's arithmetic is the same whatever `tokens` is.
    tokens: int = 1
    # One token a program: multiply each column of x by its group's two scales first (once a program),
    # keep a thread's sums across the pieces and add them up once at the end, instead of summing each
    # 128-column group across the program's threads and scaling the sum (fewer instructions a weight
    # byte, see `_row_gemv_kernel`; the same products added in another order).
    fold_scales: bool = False


def row_gemv_tiles(m: int, n: int, k: int) -> RowGemvTiles:
    """Scales folded, 4 rows a program, 2,048 columns a piece, 4 warps, one token a program. On an
    H100 the fastest single choice at one row over the four Qwen3-14B products (`python -m
    benchmarks.fp8_tiles --batches 1 --only 'row gemv'`, docs/reports/h100/fp8/row_gemv_folded/):
    119.4 us a layer against 125.0 for the unfolded 2 rows a program served before (qkv 15.0 against
    16.8, o 12.0 against 12.5, gate_up 60.8 against 62.8, down 31.6 against 32.9); o_proj alone is
    1.2 us faster at 8 rows, down_proj 1.9 us slower. One token a program at every row count, so a
    row gets the same bits alone as in a step of several (several tokens a program measured no
    faster, the module docstring; steps of more than one row are served by cuBLAS anyway)."""
    return RowGemvTiles(rows=4, chunk=min(2048, triton.next_power_of_2(max(k, BLOCK))), num_warps=4,
                        fold_scales=True)


# Token groups are the grid's fastest axis, so a step's groups read the same weight rows together (the
# second read comes from L2). The row strides are specialized on (Triton learns they are multiples
# of 16): without that, a token's row of x cannot be loaded in 16-byte vectors.
@triton.jit(do_not_specialize=["M"])
def _row_gemv_kernel(xq_ptr, xs_ptr, w_ptr, ws_ptr, c_ptr, M, N, stride_xm, stride_xsm, stride_xsg,
                     stride_wn, stride_wsn, stride_wsk, stride_cm, K: tl.constexpr,
                     ROWS: tl.constexpr, CHUNK: tl.constexpr, GROUP: tl.constexpr, EVEN: tl.constexpr,
                     TOKENS: tl.constexpr, FOLD: tl.constexpr, PDL: tl.constexpr):
    """c[m, n] = sum over K's groups g of (sum_k x_q[m, k] w[n, k]) * x_scale[m, g] * w_scale[n/128, g],
    TOKENS tokens and ROWS weight rows a program, each token with the same operations: a token
    computes alike whatever else shares its step.
    FOLD (one token): c[n] = sum_k w[n, k] * (x_q[k] * (x_scale[g(k)] * w_scale[n/128, g(k)])): the
    program's rows share one row of weight scales, so x's columns are scaled once for all of them;
    each thread sums its 16-column vectors in place and keeps those sums apart across the pieces, and
    the sum across threads happens once, not once a group (compiled for sm_90 with triton 3.6,
    `python -m benchmarks.decode_sass`: 5.4 instructions a weight byte at 4 rows and 1,024-column
    pieces against 6.5, 4.5 at 8 rows against 5.6, 6.8 against 7.4 with the default tiles; 56-79
    registers a thread at K=5,120 against 37)."""
    GROUPS: tl.constexpr = CHUNK // GROUP
    VECTOR: tl.constexpr = 16
    if PDL:  # core/execution/dependent_launch.py: the first piece's weight loads go out before the wait
        gdc_launch_dependents()
    first_token = tl.program_id(0) * TOKENS
    block = tl.program_id(1)
    rows = block * ROWS + tl.arange(0, ROWS)
    row_mask = rows < N
    ws_row = ws_ptr + ((block * ROWS) // GROUP) * stride_wsn
    acc = tl.zeros((TOKENS, ROWS), dtype=tl.float32)
    if FOLD:
        columns_acc = tl.zeros((1, ROWS, GROUPS, GROUP // VECTOR), dtype=tl.float32)
    for first in tl.static_range(0, K, CHUNK):
        cols = first + tl.arange(0, CHUNK)
        groups = first // GROUP + tl.arange(0, GROUPS)
        col_mask = cols < K
        group_mask = groups * GROUP < K
        w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wn + cols[None, :]
        if EVEN:  # whole pieces and programs: unmasked loads, the widest vectors
            w = tl.load(w_ptrs)
            w_scale = tl.load(ws_row + groups * stride_wsk)
        else:
            w = tl.load(w_ptrs, mask=row_mask[:, None] & col_mask[None, :], other=0.0)
            w_scale = tl.load(ws_row + groups * stride_wsk, mask=group_mask, other=0.0)
        if PDL and first == 0:
            gdc_wait()
        # The piece of weight, read once, times each token in turn. A token is a one-long axis of every
        # tile: the shapes of the version that held a step's tokens in one program, measured at one
        # token (127.7 us a layer).
        w4 = tl.reshape(w.to(tl.float32), (1, ROWS, GROUPS, GROUP))
        for t in tl.static_range(TOKENS):
            tokens = first_token + t + tl.arange(0, 1)
            x_ptrs = xq_ptr + tokens[:, None].to(tl.int64) * stride_xm + cols[None, :]
            xs_ptrs = xs_ptr + tokens[:, None].to(tl.int64) * stride_xsm + groups[None, :] * stride_xsg
            if TOKENS > 1:  # the last group may run past the step's tokens
                in_step = tokens[:, None] < M
                x = tl.load(x_ptrs, mask=in_step & col_mask[None, :], other=0.0)
                x_scale = tl.load(xs_ptrs, mask=in_step & group_mask[None, :], other=0.0)
            elif EVEN:
                x = tl.load(x_ptrs)
                x_scale = tl.load(xs_ptrs)
            else:
                x = tl.load(x_ptrs, mask=col_mask[None, :], other=0.0)
                x_scale = tl.load(xs_ptrs, mask=group_mask[None, :], other=0.0)
            x4 = tl.reshape(x.to(tl.float32), (1, 1, GROUPS, GROUP))
            scales = x_scale * w_scale[None, :]  # [1, GROUPS]
            if FOLD:
                # A thread's 16 adjacent columns (one 16-byte load) are summed where they lie: no
                # shuffle, and a sixteenth of the registers a sum per column would hold.
                products = w4 * (x4 * tl.reshape(scales, (1, 1, GROUPS, 1)))
                vectors = tl.reshape(products, (1, ROWS, GROUPS, GROUP // VECTOR, VECTOR))
                columns_acc += tl.sum(vectors, axis=4)
            else:
                sums = tl.sum(w4 * x4, axis=3)  # [1, ROWS, GROUPS]
                part = tl.sum(sums * scales[:, None, :], axis=2)  # [1, ROWS]
                if TOKENS == 1:
                    acc += part
                else:
                    acc = tl.where((tl.arange(0, TOKENS) == t)[:, None], acc + part, acc)
    if FOLD:
        acc += tl.reshape(tl.sum(tl.sum(columns_acc, axis=3), axis=2), (TOKENS, ROWS))
    tokens = first_token + tl.arange(0, TOKENS)
    c_ptrs = c_ptr + tokens[:, None].to(tl.int64) * stride_cm + rows[None, :]
    if TOKENS > 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(tokens[:, None] < M) & row_mask[None, :])
    else:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_mask[None, :])


def fp8_row_gemv(x_q: torch.Tensor, x_scales: torch.Tensor, weight: torch.Tensor,
                 weight_scale_inv: torch.Tensor, out_dtype: torch.dtype,
                 tiles: RowGemvTiles | None = None) -> torch.Tensor:
    """x_q fp8 [M, K] with scales [M, ceil(K/128)] times the block-scaled fp8 weight [N, K]
    transposed -> [M, N] in out_dtype."""
    m, k = x_q.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and x_q.stride(1) == 1 and weight.stride(1) == 1
    assert m <= 16, f"the row GEMV multiplies on the CUDA cores: it is for decode's few rows, not {m}"
    tiles = tiles or row_gemv_tiles(m, n, k)
    assert BLOCK % tiles.rows == 0 and tiles.chunk % BLOCK == 0 and tiles.tokens in (1, 2, 4, 8, 16), tiles
    assert not tiles.fold_scales or tiles.tokens == 1, f"scales are folded into one token's x: {tiles}"
    out = torch.empty((m, n), dtype=out_dtype, device=x_q.device)
    if m == 0:
        return out
    pdl = dependent_launch(x_q.device)
    _row_gemv_kernel[(triton.cdiv(m, tiles.tokens), triton.cdiv(n, tiles.rows))](
        x_q, x_scales, weight, weight_scale_inv, out, m, n, x_q.stride(0), x_scales.stride(0),
        x_scales.stride(1), weight.stride(0), weight_scale_inv.stride(0), weight_scale_inv.stride(1),
        out.stride(0), K=k, ROWS=tiles.rows, CHUNK=tiles.chunk, GROUP=BLOCK,
        EVEN=k % tiles.chunk == 0 and n % tiles.rows == 0, TOKENS=tiles.tokens, FOLD=tiles.fold_scales,
        PDL=pdl, num_warps=tiles.num_warps,
        **launch_options(pdl))
    return out
