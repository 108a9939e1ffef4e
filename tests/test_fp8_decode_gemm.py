"""The FP8 decode GEMM of core/execution/model/fp8_decode_gemm.py (small programs streaming the
weight, tensor-core dots) against the torch definition of the format
(core/execution/model/fp8_format.py), on the CPU through the Triton interpreter.

It takes the activations as `quantize_activations` leaves them and sums the same products as
`reference_matmul` per 128-column group in float32, so float32 outputs get the bound of
tests/test_fp8_kernels.py: max |error| <= 1e-5 * max |reference| (K <= 1,000 here).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from fp8_products import GEMM_RELATIVE_TOLERANCE, inputs, relative_error  # noqa: E402
from triton_interpreter import is_interpreted, run_in_fresh_interpreter, skip_unless_interpreted  # noqa: E402

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]')")

from core.execution.model import fp8_decode_gemm as decode_module  # noqa: E402
from core.execution.model.fp8_decode_gemm import DECODE_MAX_M, DecodeTiles, decode_gemm  # noqa: E402
from core.execution.model.fp8_format import reference_matmul  # noqa: E402
from core.execution.model.fp8_kernels import quantize_activations  # noqa: E402

INTERPRETED = is_interpreted(triton.language.zeros, decode_module._decode_gemm_kernel)


@pytest.fixture(autouse=True)
def _kernels_run_here_or_in_the_child(request):
    skip_unless_interpreted(request, INTERPRETED)


def test_kernels_in_a_fresh_interpreter():
    run_in_fresh_interpreter(__file__, INTERPRETED)


def product(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor, out_dtype: torch.dtype,
            tiles: DecodeTiles | None = None) -> torch.Tensor:
    if tiles is None:
        return decode_gemm(*quantize_activations(x), weight, scale_inv, out_dtype)
    return decode_gemm(*quantize_activations(x), weight, scale_inv, out_dtype, tiles)


@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("n,k", [(256, 512), (200, 384), (256, 200), (136, 1000)],
                         ids=["256x512", "ragged-n", "ragged-k", "ragged-both"])
def test_decode_gemm_equals_the_reference(m, n, k):
    x, weight, scale_inv = inputs(m, n, k, seed=m + n + k)
    out = product(x, weight, scale_inv, torch.float32)
    assert out.shape == (m, n) and out.dtype == torch.float32
    assert relative_error(out, reference_matmul(x, weight, scale_inv)) <= GEMM_RELATIVE_TOLERANCE


@pytest.mark.parametrize("tiles", [DecodeTiles(16, 1, 4), DecodeTiles(32, 2, 4),
                                   DecodeTiles(128, 2, 4), DecodeTiles(64, 4, 2)], ids=str)
@pytest.mark.parametrize("m", [1, 5])
def test_every_tile_shape_and_split_gives_the_reference(tiles, m):
    x, weight, scale_inv = inputs(m, 200, 1000, seed=13 * m + tiles.block_w)
    out = product(x, weight, scale_inv, torch.float32, tiles)
    assert out.shape == (m, 200)
    assert relative_error(out, reference_matmul(x, weight, scale_inv)) <= GEMM_RELATIVE_TOLERANCE


@pytest.mark.parametrize("m", [1, 6])
def test_quantizing_inside_gives_the_separate_quantizations_numbers(m):
    x, weight, scale_inv = inputs(m, 256, 640, seed=17 * m)
    for tiles in (DecodeTiles(32, 1, 4), DecodeTiles(64, 4, 4)):
        fused = decode_gemm(x, None, weight, scale_inv, torch.float32, tiles)
        assert torch.equal(fused, product(x, weight, scale_inv, torch.float32, tiles))


def test_strided_rows_and_a_zero_group():
    x, weight, scale_inv = inputs(3, 256, 384, seed=11)
    wide = torch.zeros(3, 512)
    wide[:, :384] = x
    wide[1, 128:256] = 0.0  # a group of zeros: scale MIN_AMAX / 448, values zero
    strided = wide[:, :384]
    out = product(strided, weight, scale_inv, torch.float32)
    expected = reference_matmul(strided.contiguous(), weight, scale_inv)
    assert relative_error(out, expected) <= GEMM_RELATIVE_TOLERANCE


def test_a_row_computes_the_same_alone_and_in_a_batch():
    x, weight, scale_inv = inputs(12, 256, 512, seed=7)
    batch = product(x, weight, scale_inv, torch.bfloat16)
    for row in (0, 5, 11):
        assert torch.equal(product(x[row:row + 1], weight, scale_inv, torch.bfloat16)[0], batch[row])


def test_half_precision_output_is_the_float32_result_rounded_once():
    # float16: the interpreter (triton 3.9) truncates float32 to bfloat16 where the GPU rounds
    x, weight, scale_inv = inputs(2, 256, 256, seed=5)
    full = product(x, weight, scale_inv, torch.float32)
    half = product(x, weight, scale_inv, torch.float16)
    assert half.dtype == torch.float16 and torch.equal(half, full.to(torch.float16))


def test_one_split_writes_the_output_directly():
    x, weight, scale_inv = inputs(2, 128, 384, seed=9)  # 3 groups: one program's K with 4 a program
    out = product(x, weight, scale_inv, torch.float32, DecodeTiles(64, 4, 4))
    assert relative_error(out, reference_matmul(x, weight, scale_inv)) <= GEMM_RELATIVE_TOLERANCE


def test_tiles_are_checked():
    x, weight, scale_inv = inputs(1, 128, 128, seed=2)
    for tiles in (DecodeTiles(48, 1, 4), DecodeTiles(64, 3, 4)):
        with pytest.raises(AssertionError):
            product(x, weight, scale_inv, torch.float32, tiles)


def test_the_decode_gemm_is_for_a_decode_step():
    x, weight, scale_inv = inputs(DECODE_MAX_M + 1, 128, 128, seed=3)
    with pytest.raises(AssertionError, match="16 rows"):
        product(x, weight, scale_inv, torch.float32)
