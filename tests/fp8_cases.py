"""What the CPU tests of the FP8 kernels share (test_fp8_kernels.py, test_fp8_gemv.py,
test_fp8_row_gemv.py): random decode inputs, the relative error they judge outputs by, and the
checks both decode kernels must pass."""

from __future__ import annotations

from collections.abc import Callable

import torch

from core.execution.model.fp8_format import quantize_weight, reference_matmul

# float32 outputs of a kernel against `reference_matmul`: another summation order only (see
# test_fp8_kernels.py's docstring), max |error| <= this * max |reference| for K up to ~1,000.
GEMM_RELATIVE_TOLERANCE = 1e-5


def decode_inputs(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [m, k] float32 whose 128-column groups span unlike ranges, and a block-quantized weight [n, k]
    with its scales."""
    generator = torch.Generator().manual_seed(seed)
    x = 2.0 * torch.randn(m, k, generator=generator) * torch.logspace(-2, 1, k)
    weight, scale_inv = quantize_weight(0.05 * torch.randn(n, k, generator=generator))
    return x, weight, scale_inv


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """max |got - expected| / max |expected|."""
    return float((got.float() - expected.float()).abs().max() / expected.float().abs().max())


# A decode kernel under test: (x [M, K] float, weight, scale_inv, out_dtype) -> [M, N], quantizing x itself.
Multiply = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]


def check_strided_rows_and_a_zero_group(multiply: Multiply) -> None:
    """Rows read with a stride wider than K, one 128-column group all zeros (scale MIN_AMAX / 448)."""
    x, weight, scale_inv = decode_inputs(3, 256, 384, seed=11)
    wide = torch.zeros(3, 512)
    wide[:, :384] = x
    wide[1, 128:256] = 0.0
    strided = wide[:, :384]
    out = multiply(strided, weight, scale_inv, torch.float32)
    expected = reference_matmul(strided.contiguous(), weight, scale_inv)
    assert relative_error(out, expected) <= GEMM_RELATIVE_TOLERANCE


def check_half_precision_is_the_float32_result_rounded_once(multiply: Multiply) -> None:
    # float16: the interpreter (triton 3.9) truncates float32 to bfloat16 where the GPU rounds
    x, weight, scale_inv = decode_inputs(2, 256, 256, seed=5)
    full = multiply(x, weight, scale_inv, torch.float32)
    half = multiply(x, weight, scale_inv, torch.float16)
    assert half.dtype == torch.float16 and torch.equal(half, full.to(torch.float16))
