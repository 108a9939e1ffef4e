"""Triton kernels of the block-scaled FP8 linear layer: quantize activations per token and group of
128 columns, and multiply them by a weight quantized in 128 x 128 blocks.

`quantize_activations(x)` -> (fp8 [M, K], float32 scales [M, ceil(K / 128)]) in one pass over x.
`block_fp8_matmul(x_fp8, x_scales, weight, weight_scale_inv, out_dtype)` -> [M, N]: for every
output tile and every 128-column step of K, a tensor-core dot of the fp8 tiles, scaled by the
token's group scale and the weight block's scale, summed in float32. A tile of BLOCK_N <= 128
output columns lies inside one weight block row, so one weight scale serves a tile and a K step.
For small M (decode) the GEMM may quantize the activations itself (x_scales None: one launch
instead of two; `fp8_gemm.triton_gemm` does so up to FUSED_QUANTIZATION_MAX_M rows), and it splits
K over SPLIT_K programs so that enough of them stream the weight at once; their float32 partial
sums are added in a fixed order (no atomics: the result does not depend on which program finishes
first). The tiles per M are a first guess, to be tuned per shape with
`python -m benchmarks.kernels --fp8-only --sweep`.

The quantization rounds to e4m3 itself (`round_to_e4m3`, round to nearest even) before the cast,
which then is exact: the GPU's conversion would round the same way, but the Triton interpreter's
(triton 3.9) does not carry a rounding into the exponent (124.75 becomes 64, not 128), and the CPU
tests run these kernels in the interpreter. Its divisions are IEEE (div_rn), as torch's are, so the
quantized values equal `fp8_format.quantize_activations_reference` exactly.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from core.execution.dependent_launch import dependent_launch, gdc_launch_dependents, gdc_wait, launch_options
from core.execution.model.fp8_format import BLOCK, FP8_DTYPE, FP8_MAX, MIN_AMAX

# 1.5 * 2**23: adding and subtracting it rounds a float32 of magnitude < 2**22 to an integer, ties to even.
_ROUNDING_MAGIC = tl.constexpr(12582912.0)  # a constexpr: compiled kernels read no other globals


@triton.jit
def round_to_e4m3(v):
    """v (float32, |v| <= 448) rounded to the nearest e4m3 value, ties to even."""
    bits = v.to(tl.int32, bitcast=True)
    # e4m3 has 3 mantissa bits: its spacing is 2**(exponent - 3), and 2**-9 below 2**-6 (subnormals).
    exponent = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    spacing = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)
    inverse = ((127 - (exponent - 3)) << 23).to(tl.float32, bitcast=True)  # powers of two: exact products
    return ((v * inverse + _ROUNDING_MAGIC) - _ROUNDING_MAGIC) * spacing


@triton.jit
def _quantize_rows(x, FP8_MAX_: tl.constexpr, MIN_AMAX_: tl.constexpr):
    """x [R, 128] float32 -> (its e4m3 values as float32, each row's scale = amax / 448)."""
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), MIN_AMAX_)  # [R]
    scale = tl.math.div_rn(amax, tl.full(amax.shape, FP8_MAX_, tl.float32))
    scaled = tl.math.div_rn(x, scale[:, None])
    return round_to_e4m3(tl.minimum(tl.maximum(scaled, -FP8_MAX_), FP8_MAX_)), scale


# Step-varying integers (the token count and what follows from it) are not specialized on, so one
# compiled variant serves every step.
@triton.jit(do_not_specialize=["M", "stride_sm", "stride_sg"])
def _quantize_groups_kernel(x_ptr, q_ptr, scale_ptr, M, K, stride_xm, stride_qm, stride_sm, stride_sg,
                            GROUPS: tl.constexpr, GROUP: tl.constexpr, FP8_MAX_: tl.constexpr,
                            MIN_AMAX_: tl.constexpr, SILU_MUL: tl.constexpr, PDL: tl.constexpr):
    """One token, GROUPS groups of GROUP columns: scale = amax / 448, q = round(x / scale). Rows from
    M on (padding) quantize zeros. SILU_MUL: x's row is [gate | up], K columns each, and the values
    quantized are SiLU(gate) * up rounded to x's dtype, as fused.silu_mul computes them."""
    if PDL:  # core/execution/dependent_launch.py
        gdc_launch_dependents()
        gdc_wait()
    row = tl.program_id(0)
    group = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)  # [GROUPS]
    cols = group[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # [GROUPS, GROUP]
    mask = cols < K
    in_rows = (cols * 0 + row) < M  # [GROUPS, GROUP], as a tensor: the interpreter rejects a scalar mask
    if SILU_MUL:
        gate = tl.load(x_ptr + row * stride_xm + cols, mask=mask & in_rows, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * stride_xm + K + cols, mask=mask & in_rows, other=0.0)
        silu = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)
        x = (silu.to(tl.float32) * up.to(tl.float32)).to(up.dtype).to(tl.float32)
    else:
        x = tl.load(x_ptr + row * stride_xm + cols, mask=mask & in_rows, other=0.0).to(tl.float32)
    q, scale = _quantize_rows(x, FP8_MAX_, MIN_AMAX_)
    tl.store(q_ptr + row * stride_qm + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row * stride_sm + group * stride_sg, scale, mask=group * GROUP < K)


def quantize_activations(x: torch.Tensor, column_major_scales: bool = False, rows: int | None = None,
                         silu_mul: bool = False, groups_per_program: int | None = None,
                         num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (rows may be strided) -> (fp8 [R, K], float32 scales [R, ceil(K / 128)]), R = `rows`
    (default M; more pads with quantized zeros, which a GEMM with a minimum row count wants).
    `column_major_scales` stores the scales with stride (1, R), the layout torch's scaled_mm wants.
    `silu_mul`: x is [M, 2K], gate then up (the gate/up projection's output), and what is quantized
    is SiLU(gate) * up (`fused.silu_mul`'s values exactly), without writing it out first.
    `groups_per_program` (groups of 128 columns a program) and `num_warps` shape the launch
    (`python -m benchmarks.fp8_activations --sweep`); the values do not depend on them."""
    m, k = x.shape
    if silu_mul:
        assert k % 2 == 0, f"gate and up need equal widths, got {k} columns"
        k //= 2
    rows = m if rows is None else rows
    assert x.stride(1) == 1, "x's columns must be contiguous"
    assert rows >= m, f"cannot quantize {m} rows into {rows}"
    num_groups = triton.cdiv(k, BLOCK)
    q = torch.empty((rows, k), dtype=FP8_DTYPE, device=x.device)
    if column_major_scales:
        scales = torch.empty((num_groups, rows), dtype=torch.float32, device=x.device).t()
    else:
        scales = torch.empty((rows, num_groups), dtype=torch.float32, device=x.device)
    groups_per_program = groups_per_program or min(8, triton.next_power_of_2(num_groups))
    grid = (rows, triton.cdiv(num_groups, groups_per_program))
    pdl = dependent_launch(x.device)
    _quantize_groups_kernel[grid](x, q, scales, m, k, x.stride(0), q.stride(0), scales.stride(0),
                                  scales.stride(1), GROUPS=groups_per_program, GROUP=BLOCK, FP8_MAX_=FP8_MAX,
                                  MIN_AMAX_=MIN_AMAX, SILU_MUL=silu_mul, PDL=pdl, num_warps=num_warps,
                                  **launch_options(pdl),
                                  # no FMA contraction: SiLU * up rounds where fused.silu_mul's kernel does
                                  enable_fp_fusion=not silu_mul)
    return q, scales


@triton.jit(do_not_specialize=["M", "k_steps_per_split", "stride_asg", "stride_cs"])
def _block_fp8_matmul_kernel(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, M, N, K, k_steps_per_split,
                             stride_am, stride_asm, stride_asg, stride_bn, stride_bsn, stride_bsk,
                             stride_cs, stride_cm,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             GROUP_M: tl.constexpr, QUANTIZE_A: tl.constexpr, FP8_MAX_: tl.constexpr,
                             MIN_AMAX_: tl.constexpr):
    """c[split] = sum over this split's K steps of (a_q . b_q^T) * a_scale * b_scale, in float32.
    QUANTIZE_A: a is the unquantized activations (a_scale_ptr unused), quantized here tile by tile."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Grouped order: GROUP_M row tiles share each weight tile while it is in L2.
    width = GROUP_M * num_pid_n
    first_m = (pid // width) * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_size
    pid_n = (pid % width) // group_size

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    b_scale_row = b_scale_ptr + ((pid_n * BLOCK_N) // BLOCK_K) * stride_bsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first_step = split * k_steps_per_split
    last_step = tl.minimum(first_step + k_steps_per_split, tl.cdiv(K, BLOCK_K))
    for step in range(first_step, last_step):
        k = step * BLOCK_K + offs_k
        mask_k = k < K
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0)
        b = tl.load(b_ptr + offs_n[None, :] * stride_bn + k[:, None], mask=mask_k[:, None] & mask_n[None, :],
                    other=0.0)  # [BLOCK_K, BLOCK_N]
        if QUANTIZE_A:
            a, a_scale = _quantize_rows(a.to(tl.float32), FP8_MAX_, MIN_AMAX_)
            a = a.to(b.dtype)
        else:
            a_scale = tl.load(a_scale_ptr + offs_m * stride_asm + step * stride_asg, mask=mask_m, other=0.0)
        b_scale = tl.load(b_scale_row + step * stride_bsk)
        acc += tl.dot(a, b) * (a_scale[:, None] * b_scale)
    c = c_ptr + split * stride_cs + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@functools.cache
def num_sms_of(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


class MatmulTiles(NamedTuple):
    block_m: int
    block_n: int  # divides 128: a tile's columns share one weight scale
    split_k: int
    num_warps: int
    num_stages: int


def matmul_tiles(m: int, n: int, k: int, num_sms: int = 132) -> MatmulTiles:
    """A first guess per shape; `benchmarks.kernels --fp8` measures the alternatives."""
    if m <= 16:
        block_m, block_n = 16, 64
    elif m <= 64:
        block_m, block_n = 64, 64
    else:
        block_m, block_n = 128, 128
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    k_steps = triton.cdiv(k, BLOCK)
    split_k = 1
    while m <= 64 and tiles * split_k < 2 * num_sms and split_k * 2 <= k_steps // 4:
        split_k *= 2
    return MatmulTiles(block_m, block_n, split_k, num_warps=4 if block_m < 128 else 8,
                       num_stages=4 if m <= 64 else 3)


def split_k_partials(m: int, n: int, split_k: int, out_dtype: torch.dtype, device: torch.device
                     ) -> torch.Tensor:
    """Where a split-K kernel writes: [split_k, M, N] float32 partial sums, or with one split the
    output itself ([1, M, N] in out_dtype); `sum_split_k` turns either into the [M, N] result."""
    if split_k == 1:
        return torch.empty((1, m, n), dtype=out_dtype, device=device)
    return torch.empty((split_k, m, n), dtype=torch.float32, device=device)


def sum_split_k(partials: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return partials[0] if partials.shape[0] == 1 else partials.sum(dim=0).to(out_dtype)


def block_fp8_matmul(x_q: torch.Tensor, x_scales: torch.Tensor | None, weight: torch.Tensor,
                     weight_scale_inv: torch.Tensor, out_dtype: torch.dtype,
                     tiles: MatmulTiles | None = None) -> torch.Tensor:
    """x_q fp8 [M, K] with scales [M, ceil(K/128)], weight fp8 [N, K] with weight_scale_inv
    [ceil(N/128), ceil(K/128)] -> x times the weight transposed, [M, N] in out_dtype.
    x_scales None: x_q is the unquantized activations, which each program quantizes as
    `quantize_activations` would (one launch instead of two, for small M: every column tile of
    the output quantizes the rows again)."""
    m, k = x_q.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and x_q.stride(1) == 1 and weight.stride(1) == 1
    if tiles is None:
        tiles = matmul_tiles(m, n, k, num_sms_of(x_q.device))
    assert BLOCK % tiles.block_n == 0, f"block_n {tiles.block_n} must divide {BLOCK}"
    k_steps = triton.cdiv(k, BLOCK)
    k_steps_per_split = triton.cdiv(k_steps, tiles.split_k)
    split_k = triton.cdiv(k_steps, k_steps_per_split)
    partials = split_k_partials(m, n, split_k, out_dtype, x_q.device)
    grid = (triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n), split_k)
    quantize_a = x_scales is None
    scales = weight_scale_inv if quantize_a else x_scales  # unread when quantize_a
    _block_fp8_matmul_kernel[grid](
        x_q, scales, weight, weight_scale_inv, partials, m, n, k, k_steps_per_split,
        x_q.stride(0), scales.stride(0), scales.stride(1), weight.stride(0),
        weight_scale_inv.stride(0), weight_scale_inv.stride(1), partials.stride(0), partials.stride(1),
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=BLOCK, GROUP_M=8, QUANTIZE_A=quantize_a,
        FP8_MAX_=FP8_MAX, MIN_AMAX_=MIN_AMAX, num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return sum_split_k(partials, out_dtype)
