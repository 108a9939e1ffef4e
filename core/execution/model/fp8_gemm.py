"""The ways to multiply activations by a block-scaled FP8 weight, and which one a layer uses.

Each is a function (x [M, K] in the model's dtype, weight fp8 [N, K], weight_scale_inv
[ceil(N/128), ceil(K/128)]) -> [M, N] in x's dtype:

* `dequant`: the weight dequantized to x's dtype, then one ordinary matmul; the activations stay
  as they are (weight-only quantization). The CPU serves this, and it is the tests' reference.
* `triton`: up to GEMV_MAX_M rows (decode) the CUDA-core GEMV of fp8_gemv.py, which quantizes the
  activations itself; above, activations quantized per token and 128 columns, then the
  block-scaled tensor-core GEMM of fp8_kernels.py (up to 16 rows it quantizes them itself).
* `scaled_mm`: decode as `triton`; above GEMV_MAX_M rows the same activation quantization, then
  torch's `scaled_mm` with 1 x 128 and 128 x 128 block scales (cuBLASLt; PyTorch >= 2.10 built
  with CUDA >= 12.9, Hopper; it refuses a single row).

`CADENCE_FP8_GEMM` (auto, dequant, triton, scaled_mm) chooses for every FP8 layer of the process;
auto is triton on a GPU and dequant on the CPU. Which is fastest per shape is measured by
`python -m benchmarks.kernels --fp8`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from core.execution.model.fp8_format import dequantize_weight

ENV = "CADENCE_FP8_GEMM"
# Up to this many rows the Triton GEMM quantizes the activations itself (one launch, not two); above
# it, every output column tile would quantize the rows again. A first guess, to measure.
FUSED_QUANTIZATION_MAX_M = 16
Fp8Gemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def dequant_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor) -> torch.Tensor:
    return F.linear(x, dequantize_weight(weight, weight_scale_inv).to(x.dtype))


def triton_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor) -> torch.Tensor:
    from core.execution.model.fp8_gemv import GEMV_MAX_M, fp8_gemv
    from core.execution.model.fp8_kernels import block_fp8_matmul, quantize_activations

    if x.shape[0] <= GEMV_MAX_M:  # decode: a weight read, on the CUDA cores
        return fp8_gemv(x, weight, weight_scale_inv, x.dtype)
    if x.shape[0] <= FUSED_QUANTIZATION_MAX_M:  # decode: the GEMM quantizes its rows itself
        return block_fp8_matmul(x, None, weight, weight_scale_inv, x.dtype)
    x_q, x_scales = quantize_activations(x)
    return block_fp8_matmul(x_q, x_scales, weight, weight_scale_inv, x.dtype)


def scaled_mm_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor) -> torch.Tensor:
    from torch.nn.functional import ScalingType, SwizzleType

    from core.execution.model.fp8_gemv import GEMV_MAX_M, fp8_gemv
    from core.execution.model.fp8_kernels import quantize_activations

    if x.shape[0] <= GEMV_MAX_M:
        return fp8_gemv(x, weight, weight_scale_inv, x.dtype)
    x_q, x_scales = quantize_activations(x, column_major_scales=True)  # scales [M, K/128], stride (1, M)
    # weight.t() is [K, N] column-major; weight_scale_inv.t() is [K/128, N/128] with stride (1, K/128).
    return F.scaled_mm(x_q, weight.t(), x_scales, ScalingType.BlockWise1x128, weight_scale_inv.t(),
                       ScalingType.BlockWise128x128, swizzle_a=SwizzleType.NO_SWIZZLE,
                       swizzle_b=SwizzleType.NO_SWIZZLE, output_dtype=x.dtype)


FP8_GEMMS: dict[str, Fp8Gemm] = {"dequant": dequant_gemm, "triton": triton_gemm, "scaled_mm": scaled_mm_gemm}


def choose_gemm(device: torch.device, name: str | None = None) -> Fp8Gemm:
    """The GEMM named by `name` (default: $CADENCE_FP8_GEMM, else auto) for layers on `device`."""
    name = name or os.environ.get(ENV, "auto")
    if name == "auto":
        name = "triton" if device.type == "cuda" else "dequant"
    if name not in FP8_GEMMS:
        raise ValueError(f"{ENV}={name!r} is not an FP8 GEMM: use auto or one of {', '.join(FP8_GEMMS)}")
    if name != "dequant" and device.type != "cuda":
        raise ValueError(f"{ENV}={name}: the {name} FP8 GEMM needs a CUDA device, the model is on {device}")
    return FP8_GEMMS[name]
