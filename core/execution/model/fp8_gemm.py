"""The ways to multiply activations by a block-scaled FP8 weight, and which one a layer uses.

Each is a function (x [M, K] in the model's dtype, weight fp8 [N, K], weight_scale_inv
[ceil(N/128), ceil(K/128)]) -> [M, N] in x's dtype:

* `dequant`: the weight dequantized to x's dtype, then one ordinary matmul; the activations stay
  as they are (weight-only quantization). The CPU serves this, and it is the tests' reference.
* `triton`: activations quantized per token and 128 columns (`fp8_kernels.quantize_activations`),
  then at one row the row GEMV of fp8_row_gemv.py, up to GEMV_MAX_M rows (decode) the CUDA-core
  GEMV of fp8_gemv.py, above the block-scaled tensor-core GEMM of fp8_kernels.py (up to 16 rows it
  quantizes the rows itself).
* `scaled_mm`: the same activation quantization, into a row count padded to a multiple of 16, then
  torch's `scaled_mm` with 1 x 128 and 128 x 128 block scales (cuBLASLt; PyTorch >= 2.10 built with
  CUDA >= 12.9, Hopper). cuBLAS refused 1 and 9 rows on an H100 with torch 2.11 and ran 16, 32, 64,
  256, 1,784 and 8,192, hence the padding; a decode step's padded rows cost nothing, the step
  reads the weight once either way.
* `row_gemv`: scaled_mm, except a step of one row (decode at concurrency 1), which takes the row
  GEMV of fp8_row_gemv.py: a program owns whole weight rows and reads them like a plain read of
  the weight. Measured on one H100 at one row (`python -m benchmarks.fp8_tiles`, quantization
  included): 132 us a layer against scaled_mm's 164 (qkv 18.7 / 21.2, o 14.4 / 20.0, gate/up
  64.1 / 79.3, down 34.8 / 43.6); at two rows it loses (175 against 164), hence one. Served back to
  back: concurrency-1 TPOT 6.84 ms against scaled_mm's 8.11. A request decoding alone computes
  its products otherwise than in a step of several (scaled_mm pads every step of up to 16 rows to
  one 16-row product), so in FP8, whose activation quantization turns last-bit differences into
  steps, its greedy tokens may differ at near-ties between the two (vLLM and SGLang make the same
  trade: their kernels change with the batch size).

The MLP's down projection multiplies SiLU(gate) * up: `GATED_GEMMS` holds each quantizing GEMM
taking the gate/up output itself (`gated=True`), its activation quantization computing SiLU * up
on the way (`fp8_kernels.quantize_activations(silu_mul=True)`: the same values, one kernel and one
pass over the activations fewer).

`CADENCE_FP8_GEMM` (auto, dequant, triton, scaled_mm, row_gemv) chooses for every FP8 layer of the
process; auto is row_gemv where cuBLAS's block-scaled scaled_mm runs (checked once on a small
product), else triton, and dequant on the CPU; scaled_mm or row_gemv named explicitly is refused at
start, with cuBLAS's reason, where it cannot run.
Measured on an H100 (docs/reports/h100/fp8): per GEMM (`python -m benchmarks.fp8_tiles`) scaled_mm
runs the prefill shapes at 950-1,150 TFLOP/s against 700-800 for the Triton GEMM; served, FP8 with
scaled_mm decodes at 8.37 ms a token (bf16 11.37) and runs 1,784/256 at concurrency 302 at
19,949-19,998 tok/s (two runs; bf16 14,786).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from core.execution.model.fp8_format import dequantize_weight
from core.execution.model.fused import silu_mul

log = logging.getLogger(__name__)
ENV = "CADENCE_FP8_GEMM"
SCALED_MM_ROW_MULTIPLE = 16
# Up to this many rows the Triton GEMM quantizes the activations itself (one launch, not two); above
# it, every output column tile would quantize the rows again. A first guess, to measure.
FUSED_QUANTIZATION_MAX_M = 16
Fp8Gemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def dequant_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor) -> torch.Tensor:
    return F.linear(x, dequantize_weight(weight, weight_scale_inv).to(x.dtype))


# `gated` (GATED_GEMMS): x is [M, 2K], gate then up, and the activations multiplied are SiLU(gate) * up.


def triton_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                gated: bool = False) -> torch.Tensor:
    from core.execution.model.fp8_gemv import GEMV_MAX_M, fp8_gemv
    from core.execution.model.fp8_kernels import block_fp8_matmul, quantize_activations
    from core.execution.model.fp8_row_gemv import ROW_GEMV_MAX_M, fp8_row_gemv

    if x.shape[0] <= ROW_GEMV_MAX_M:  # decode at concurrency 1: whole weight rows a program
        return fp8_row_gemv(*quantize_activations(x, silu_mul=gated), weight, weight_scale_inv, x.dtype)
    if x.shape[0] <= GEMV_MAX_M:  # decode: a weight read, on the CUDA cores
        return fp8_gemv(*quantize_activations(x, silu_mul=gated), weight, weight_scale_inv, x.dtype)
    if x.shape[0] <= FUSED_QUANTIZATION_MAX_M:  # decode: the GEMM quantizes its rows itself
        return block_fp8_matmul(silu_mul(x) if gated else x, None, weight, weight_scale_inv, x.dtype)
    x_q, x_scales = quantize_activations(x, silu_mul=gated)
    return block_fp8_matmul(x_q, x_scales, weight, weight_scale_inv, x.dtype)


def scaled_mm_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                   gated: bool = False) -> torch.Tensor:
    from core.execution.model.fp8_kernels import quantize_activations

    if weight_scale_inv.shape[1] % 4:  # torch wants the K blocks' scales in fours (TP 4 and 8 shards)
        return triton_gemm(x, weight, weight_scale_inv, gated)
    m = x.shape[0]
    rows = -(-m // SCALED_MM_ROW_MULTIPLE) * SCALED_MM_ROW_MULTIPLE
    # x_q [rows, K]; scales [rows, K/128] with stride (1, rows); padded rows are zeros.
    x_q, x_scales = quantize_activations(x, column_major_scales=True, rows=rows, silu_mul=gated)
    out = scaled_mm_product(x_q, x_scales, weight, weight_scale_inv, x.dtype)
    return out if rows == m else out[:m]


def scaled_mm_product(x_q: torch.Tensor, x_scales: torch.Tensor, weight: torch.Tensor,
                      weight_scale_inv: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """cuBLAS's block-scaled GEMM of rows quantized in scaled_mm's layout (a multiple of 16 rows,
    column-major scales) -> [rows, N]."""
    from torch.nn.functional import ScalingType, SwizzleType

    # weight.t() is [K, N] column-major; weight_scale_inv.t() is [K/128, N/128] with stride (1, K/128).
    return F.scaled_mm(x_q, weight.t(), x_scales, ScalingType.BlockWise1x128, weight_scale_inv.t(),
                       ScalingType.BlockWise128x128, swizzle_a=SwizzleType.NO_SWIZZLE,
                       swizzle_b=SwizzleType.NO_SWIZZLE, output_dtype=out_dtype)


def row_gemv_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                  gated: bool = False) -> torch.Tensor:
    from core.execution.model.fp8_row_gemv import ROW_GEMV_MAX_M

    if x.shape[0] <= ROW_GEMV_MAX_M:  # triton_gemm's row GEMV
        return triton_gemm(x, weight, weight_scale_inv, gated)
    return scaled_mm_gemm(x, weight, weight_scale_inv, gated)


@functools.cache
def scaled_mm_unavailable(device: torch.device) -> str | None:
    """None where torch's block-scaled scaled_mm runs on `device`; else why not (one small product)."""
    try:
        x = torch.ones((3, 512), dtype=torch.bfloat16, device=device)
        weight = torch.ones((256, 512), dtype=torch.bfloat16, device=device).to(torch.float8_e4m3fn)
        out = scaled_mm_gemm(x, weight, torch.ones((2, 4), dtype=torch.float32, device=device))
        torch.cuda.synchronize(device)
        if out.shape != (3, 256) or not torch.all(out == 512):
            return f"block-scaled scaled_mm gave {out.flatten()[:4].tolist()} for 512"
        return None
    except Exception as exc:  # an old torch (no ScalingType), an old CUDA or GPU: cuBLAS refuses
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


@functools.cache
def _log_auto_choice(device: torch.device, name: str) -> None:
    why = f": cuBLAS's block-scaled scaled_mm cannot run here ({scaled_mm_unavailable(device)})" \
        if name == "triton" else ""
    log.info("FP8 GEMM on %s: %s%s", device, name, why)


FP8_GEMMS: dict[str, Fp8Gemm] = {"dequant": dequant_gemm, "triton": triton_gemm, "scaled_mm": scaled_mm_gemm,
                                  "row_gemv": row_gemv_gemm}
NEEDS_SCALED_MM = ("scaled_mm", "row_gemv")
GATED_GEMMS: dict[Fp8Gemm, Fp8Gemm] = {gemm: functools.partial(gemm, gated=True)
                                       for gemm in (triton_gemm, scaled_mm_gemm, row_gemv_gemm)}


def choose_gemm(device: torch.device, name: str | None = None) -> Fp8Gemm:
    """The GEMM named by `name` (default: $CADENCE_FP8_GEMM, else auto) for layers on `device`."""
    name = name or os.environ.get(ENV, "auto")
    if name == "auto":
        if device.type != "cuda":
            name = "dequant"
        else:
            name = "triton" if scaled_mm_unavailable(device) else "row_gemv"
            _log_auto_choice(device, name)
    if name not in FP8_GEMMS:
        raise ValueError(f"{ENV}={name!r} is not an FP8 GEMM: use auto or one of {', '.join(FP8_GEMMS)}")
    if name != "dequant" and device.type != "cuda":
        raise ValueError(f"{ENV}={name}: the {name} FP8 GEMM needs a CUDA device, the model is on {device}")
    if name in NEEDS_SCALED_MM and scaled_mm_unavailable(device):
        raise ValueError(f"{ENV}={name}: torch {torch.__version__} cannot run the block-scaled scaled_mm "
                         f"here ({scaled_mm_unavailable(device)}); use triton")
    return FP8_GEMMS[name]
