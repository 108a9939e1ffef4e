"""The FP8 decode GEMV of core/execution/model/fp8_gemv.py against the torch definition of the format
(core/execution/model/fp8_format.py), on the CPU through the Triton interpreter.

The GEMV takes the activations as `quantize_activations` leaves them and sums the same products as
`reference_matmul` in another order (element by element per 128-column group, over K once at the
end), so float32 outputs get the bound of tests/test_fp8_kernels.py: max |error| <= 1e-5 * max
|reference| (K <= 1,000 here).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from fp8_cases import (  # noqa: E402
    GEMM_RELATIVE_TOLERANCE,
    check_half_precision_is_the_float32_result_rounded_once,
    check_strided_rows_and_a_zero_group,
    decode_inputs,
    relative_error,
)
from triton_interpreter import is_interpreted, run_in_fresh_interpreter, skip_unless_interpreted  # noqa: E402

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]')")

from core.execution.model import fp8_gemv as gemv_module  # noqa: E402
from core.execution.model.fp8_format import reference_matmul  # noqa: E402
from core.execution.model.fp8_gemv import (  # noqa: E402
    GEMV_MAX_M,
    GemvTiles,
    fp8_gemv,
    gemv_tiles,
)
from core.execution.model.fp8_kernels import quantize_activations  # noqa: E402

INTERPRETED = is_interpreted(triton.language.zeros, gemv_module._fp8_gemv_kernel)


@pytest.fixture(autouse=True)
def _kernels_run_here_or_in_the_child(request):
    skip_unless_interpreted(request, INTERPRETED)


def test_kernels_in_a_fresh_interpreter():
    run_in_fresh_interpreter(__file__, INTERPRETED)


def gemv(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor, out_dtype: torch.dtype,
         tiles: GemvTiles | None = None) -> torch.Tensor:
    return fp8_gemv(*quantize_activations(x), weight, scale_inv, out_dtype, tiles)


@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("n,k", [(256, 512), (200, 384), (256, 200), (136, 1000)],
                         ids=["256x512", "ragged-n", "ragged-k", "ragged-both"])
def test_gemv_equals_the_reference(m, n, k):
    x, weight, scale_inv = decode_inputs(m, n, k, seed=m + n + k)
    out = gemv(x, weight, scale_inv, torch.float32)
    assert out.shape == (m, n) and out.dtype == torch.float32
    assert relative_error(out, reference_matmul(x, weight, scale_inv)) <= GEMM_RELATIVE_TOLERANCE


@pytest.mark.parametrize("tiles", [GemvTiles(16, 1, 3, 4), GemvTiles(8, 3, 2, 4), GemvTiles(128, 2, 1, 4),
                                   GemvTiles(32, 4, 3, 2)], ids=str)
@pytest.mark.parametrize("m", [1, 3])
def test_every_tile_shape_and_split_gives_the_reference(tiles, m):
    x, weight, scale_inv = decode_inputs(m, 200, 1000, seed=13 * m + tiles.block_n)
    out = gemv(x, weight, scale_inv, torch.float32, tiles)
    assert out.shape == (m, 200)
    assert relative_error(out, reference_matmul(x, weight, scale_inv)) <= GEMM_RELATIVE_TOLERANCE


def test_strided_rows_and_a_zero_group():
    check_strided_rows_and_a_zero_group(gemv)


def test_half_precision_output_is_the_float32_result_rounded_once():
    check_half_precision_is_the_float32_result_rounded_once(gemv)


def test_decode_tiles_for_the_qwen3_14b_products_are_the_measured_ones():
    # (n, k) -> (block_n, split_k) at 1 row, as benchmarks.fp8_tiles measured best on an H100
    measured = {(7168, 5120): (8, 1), (5120, 5120): (8, 1), (34816, 5120): (32, 1), (5120, 17408): (8, 2)}
    for (n, k), (block_n, split_k) in measured.items():
        assert gemv_tiles(1, n, k, num_sms=132)[:2] == (block_n, split_k)
    for n, k in measured:
        for m in range(1, GEMV_MAX_M + 1):
            tiles = gemv_tiles(m, n, k, num_sms=132)
            assert 128 % tiles.block_n == 0 and tiles.split_k in (1, 2)


def test_the_gemv_is_for_a_few_rows():
    x, weight, scale_inv = decode_inputs(17, 128, 128, seed=3)
    with pytest.raises(AssertionError, match="decode"):
        gemv(x, weight, scale_inv, torch.float32)
