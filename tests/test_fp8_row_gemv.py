"""The FP8 row GEMV of core/execution/model/fp8_row_gemv.py against the torch definition of the format
(core/execution/model/fp8_format.py), on the CPU through the Triton interpreter.

It takes the activations as `quantize_activations` leaves them and sums the same products as
`reference_matmul` in another order (per 128-column group, then the groups in order), so float32
outputs get the bound of tests/test_fp8_kernels.py: max |error| <= 1e-5 * max |reference|.
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

from core.execution.model import fp8_row_gemv as row_gemv_module  # noqa: E402
from core.execution.model.fp8_format import reference_matmul  # noqa: E402
from core.execution.model.fp8_kernels import quantize_activations  # noqa: E402
from core.execution.model.fp8_row_gemv import RowGemvTiles, fp8_row_gemv, row_gemv_tiles  # noqa: E402

INTERPRETED = is_interpreted(triton.language.zeros, row_gemv_module._row_gemv_kernel)


@pytest.fixture(autouse=True)
def _kernels_run_here_or_in_the_child(request):
    skip_unless_interpreted(request, INTERPRETED)


def test_kernels_in_a_fresh_interpreter():
    run_in_fresh_interpreter(__file__, INTERPRETED)


def row_gemv(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor, out_dtype: torch.dtype,
             tiles: RowGemvTiles | None = None) -> torch.Tensor:
    return fp8_row_gemv(*quantize_activations(x), weight, scale_inv, out_dtype, tiles)


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("n,k", [(256, 1024), (200, 384), (256, 200), (136, 1000)],
                         ids=["whole-pieces", "ragged-n", "ragged-k", "ragged-both"])
def test_row_gemv_equals_the_reference(m, n, k):
    x, weight, scale_inv = decode_inputs(m, n, k, seed=m + n + k)
    out = row_gemv(x, weight, scale_inv, torch.float32)
    assert out.shape == (m, n) and out.dtype == torch.float32
    assert relative_error(out, reference_matmul(x, weight, scale_inv)) <= GEMM_RELATIVE_TOLERANCE


@pytest.mark.parametrize("tiles", [RowGemvTiles(1, 512, 4), RowGemvTiles(2, 256, 4), RowGemvTiles(8, 512, 8),
                                   RowGemvTiles(128, 128, 4), RowGemvTiles(2, 256, 4, tokens=2),
                                   RowGemvTiles(4, 512, 4, tokens=4),
                                   RowGemvTiles(2, 256, 4, fold_scales=True),
                                   RowGemvTiles(8, 512, 4, fold_scales=True)], ids=str)
def test_every_tile_shape_gives_the_reference(tiles):
    # K = 520: the last piece ragged at every chunk. N: five programs' rows and one more, so the last
    # program is ragged (136 for the 128-row tile), and no more programs than that: the interpreter
    # runs each one in turn.
    n = 5 * tiles.rows + 1 if tiles.rows < 128 else 136
    x, weight, scale_inv = decode_inputs(3, n, 520, seed=tiles.rows + tiles.chunk)
    out = row_gemv(x, weight, scale_inv, torch.float32, tiles)
    assert relative_error(out, reference_matmul(x, weight, scale_inv)) <= GEMM_RELATIVE_TOLERANCE


def test_strided_rows_and_a_zero_group():
    check_strided_rows_and_a_zero_group(row_gemv)


def test_half_precision_output_is_the_float32_result_rounded_once():
    check_half_precision_is_the_float32_result_rounded_once(row_gemv)


def test_default_tiles_are_the_measured_ones():
    folded = RowGemvTiles(rows=4, chunk=2048, num_warps=4, tokens=1, fold_scales=True)
    assert row_gemv_tiles(1, 7168, 5120) == folded
    assert row_gemv_tiles(1, 5120, 17408) == folded
    assert row_gemv_tiles(1, 64, 100) == folded._replace(chunk=128)
    assert {row_gemv_tiles(m, 5120, 5120) for m in (2, 3, 4, 8, 16)} == {folded}


@pytest.mark.parametrize("m", [3, 5])  # within one group of 4 tokens, and across two
def test_a_row_alone_computes_as_in_a_step_of_several(m):
    """Alone and in a step of m, with the default tiles or several tokens a program (which read
    their weight rows once), a row gets the same bits."""
    x, weight, scale_inv = decode_inputs(m, 64, 1000, seed=m)  # 64 weight rows: half a scale block
    together = row_gemv(x, weight, scale_inv, torch.float32)
    one_a_program = row_gemv(x, weight, scale_inv, torch.float32, RowGemvTiles(2, 1024, 4, tokens=1))
    four_a_program = row_gemv(x, weight, scale_inv, torch.float32, RowGemvTiles(2, 1024, 4, tokens=4))
    assert torch.equal(four_a_program, one_a_program)
    for row in range(m):
        assert torch.equal(row_gemv(x[row:row + 1], weight, scale_inv, torch.float32), together[row:row + 1])


def test_scales_are_folded_into_one_token_a_program_only():
    x, weight, scale_inv = decode_inputs(2, 128, 256, seed=2)
    with pytest.raises(AssertionError, match="one token's x"):
        row_gemv(x, weight, scale_inv, torch.float32, RowGemvTiles(2, 256, 4, tokens=2, fold_scales=True))


def test_the_row_gemv_is_for_a_few_rows():
    x, weight, scale_inv = decode_inputs(17, 128, 128, seed=1)
    with pytest.raises(AssertionError, match="decode's few rows"):
        row_gemv(x, weight, scale_inv, torch.float32)
