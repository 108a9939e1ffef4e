"""The FP8 decode GEMV of core/execution/model/fp8_gemv.py against the torch definition of the format
(core/execution/model/fp8_format.py), on the CPU through the Triton interpreter.

The GEMV quantizes the activations as `quantize_activations` does and sums the same products as
`reference_matmul` in another order (per K step, the dequantized activations times the fp8 weight),
so float32 outputs get the bound of tests/test_fp8_kernels.py: max |error| <= 1e-5 * max |reference|
(K <= 1,000 here).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from triton_interpreter import is_interpreted, run_in_fresh_interpreter, skip_unless_interpreted  # noqa: E402

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]')")

from core.execution.model import fp8_gemv as gemv_module  # noqa: E402
from core.execution.model.fp8_format import quantize_weight, reference_matmul  # noqa: E402
from core.execution.model.fp8_gemv import (  # noqa: E402
    GEMV_MAX_M,
    GemvTiles,
    fp8_gemv,
    fp8_gemv_prequantized,
    gemv_tiles,
)
from core.execution.model.fp8_kernels import quantize_activations  # noqa: E402

INTERPRETED = is_interpreted(triton.language.zeros, gemv_module._fp8_gemv_kernel)
GEMM_RELATIVE_TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def _kernels_run_here_or_in_the_child(request):
    skip_unless_interpreted(request, INTERPRETED)


def test_kernels_in_a_fresh_interpreter():
    run_in_fresh_interpreter(__file__, INTERPRETED)


def inputs(m: int, n: int, k: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    x = 2.0 * torch.randn(m, k, generator=generator) * torch.logspace(-2, 1, k)  # groups of unlike ranges
    weight, scale_inv = quantize_weight(0.05 * torch.randn(n, k, generator=generator))
    return x, weight, scale_inv


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected.float()).abs().max() / expected.float().abs().max())


@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("n,k", [(256, 512), (200, 384), (256, 200), (136, 1000)],
                         ids=["256x512", "ragged-n", "ragged-k", "ragged-both"])
def test_gemv_equals_the_reference(m, n, k):
    x, weight, scale_inv = inputs(m, n, k, seed=m + n + k)
    out = fp8_gemv(x, weight, scale_inv, torch.float32)
    assert out.shape == (m, n) and out.dtype == torch.float32
    assert relative_error(out, reference_matmul(x, weight, scale_inv)) <= GEMM_RELATIVE_TOLERANCE


@pytest.mark.parametrize("tiles", [GemvTiles(1, 16, 128, 1, 4), GemvTiles(4, 8, 256, 3, 4),
                                   GemvTiles(2, 128, 512, 2, 4), GemvTiles(8, 32, 128, 4, 2)], ids=str)
def test_every_tile_shape_and_split_gives_the_reference(tiles):
    m = min(tiles.block_m, 3)
    x, weight, scale_inv = inputs(m, 256, 640, seed=7)
    out = fp8_gemv(x, weight, scale_inv, torch.float32, tiles)
    assert relative_error(out, reference_matmul(x, weight, scale_inv)) <= GEMM_RELATIVE_TOLERANCE


def test_strided_rows_and_a_zero_group():
    x, weight, scale_inv = inputs(3, 256, 384, seed=11)
    wide = torch.zeros(3, 512)
    wide[:, :384] = x
    wide[1, 128:256] = 0.0  # a group of zeros: scale MIN_AMAX / 448, values zero
    strided = wide[:, :384]
    out = fp8_gemv(strided, weight, scale_inv, torch.float32)
    expected = reference_matmul(strided.contiguous(), weight, scale_inv)
    assert relative_error(out, expected) <= GEMM_RELATIVE_TOLERANCE


def test_half_precision_output_is_the_float32_result_rounded_once():
    # float16: the interpreter (triton 3.9) truncates float32 to bfloat16 where the GPU rounds
    x, weight, scale_inv = inputs(2, 256, 256, seed=5)
    full = fp8_gemv(x, weight, scale_inv, torch.float32)
    half = fp8_gemv(x, weight, scale_inv, torch.float16)
    assert half.dtype == torch.float16 and torch.equal(half, full.to(torch.float16))


def test_decode_tiles_fill_the_gpu_without_splitting_the_big_qwen3_14b_layers():
    for n, k in [(7168, 5120), (5120, 5120), (34816, 5120), (5120, 17408)]:
        for m in range(1, GEMV_MAX_M + 1):
            tiles = gemv_tiles(m, n, k, num_sms=132)
            assert tiles.block_m >= m and 128 % tiles.block_n == 0 and tiles.block_k % 128 == 0
            assert tiles.block_m * tiles.block_n * tiles.block_k <= 16384  # 128 product values a thread
            assert -(-n // tiles.block_n) * tiles.split_k >= 2 * 132


@pytest.mark.parametrize("defer_sum", [False, True], ids=["sum-each-step", "sum-once"])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("block_n,split_k", [(16, 1), (8, 3), (128, 2)])
def test_the_prequantized_gemv_equals_the_reference(m, block_n, split_k, defer_sum):
    x, weight, scale_inv = inputs(m, 200, 1000, seed=13 * m + block_n)
    x_q, x_scales = quantize_activations(x)
    out = fp8_gemv_prequantized(x_q, x_scales, weight, scale_inv, torch.float32, block_n, split_k,
                                num_stages=2, defer_sum=defer_sum)
    assert out.shape == (m, 200)
    assert relative_error(out, reference_matmul(x, weight, scale_inv)) <= GEMM_RELATIVE_TOLERANCE
