"""Inputs and the error measure the FP8 decode-kernel tests share (tests/test_fp8_gemv.py,
tests/test_fp8_decode_gemm.py): activations whose 128-column groups span unlike ranges and a weight
quantized as a checkpoint would hold it; float32 outputs get max |error| <= 1e-5 * max |reference|
against `fp8_format.reference_matmul` (K <= 1,000 here)."""

from __future__ import annotations

import torch

from core.execution.model.fp8_format import quantize_weight

GEMM_RELATIVE_TOLERANCE = 1e-5


def inputs(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x [m, k] float32, weight fp8 [n, k], weight_scale_inv)."""
    generator = torch.Generator().manual_seed(seed)
    x = 2.0 * torch.randn(m, k, generator=generator) * torch.logspace(-2, 1, k)  # groups of unlike ranges
    weight, scale_inv = quantize_weight(0.05 * torch.randn(n, k, generator=generator))
    return x, weight, scale_inv


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected.float()).abs().max() / expected.float().abs().max())
