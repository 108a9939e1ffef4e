"""The Triton kernels of core/execution/model/fp8_kernels.py against the torch definition of the format
(core/execution/model/fp8_format.py), on the CPU through the Triton interpreter.

As in tests/test_fused_ops.py, the interpreter is on only if TRITON_INTERPRET=1 is set before triton is
first imported: run alone this file sets it itself, and in a full test run
`test_kernels_in_a_fresh_interpreter` runs it again in a child process.

Tolerances. The activation quantization must equal the reference bit for bit (values and scales):
both divide in IEEE float32 and round to nearest even (the kernel rounds to e4m3 itself; see its
module docstring). The GEMM then multiplies the same fp8 values and scales as the reference, so
they differ only in the order of float32 sums: per 128-column step the kernel adds exact fp8
products, the reference adds products of already-scaled float32 values. The bound is
max |kernel - reference| <= 1e-5 * max |reference| for float32 outputs (K <= 640 here: about
K * 2**-24 relative, with room); split-K changes only that order, so it gets the same bound.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from fp8_cases import GEMM_RELATIVE_TOLERANCE, relative_error  # noqa: E402
from triton_interpreter import is_interpreted, run_in_fresh_interpreter, skip_unless_interpreted  # noqa: E402

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]')")

from core.execution.model import fp8_kernels  # noqa: E402
from core.execution.model.fp8_format import (  # noqa: E402
    FP8_DTYPE,
    quantize_activations_reference,
    quantize_weight,
    reference_matmul,
)
from core.execution.model.fp8_kernels import (  # noqa: E402
    MatmulTiles,
    block_fp8_matmul,
    matmul_tiles,
    quantize_activations,
)
from core.execution.model.fused import silu_mul  # noqa: E402

INTERPRETED = is_interpreted(triton.language.zeros, fp8_kernels._quantize_groups_kernel)


@pytest.fixture(autouse=True)
def _kernels_run_here_or_in_the_child(request):
    skip_unless_interpreted(request, INTERPRETED)


def test_kernels_in_a_fresh_interpreter():
    run_in_fresh_interpreter(__file__, INTERPRETED)


def random(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- activation quantization ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m,k", [(1, 128), (7, 384), (64, 256), (3, 200)])
def test_quantized_activations_equal_the_reference_bit_for_bit(m, k, dtype):
    x = (random(m, k + 16, seed=k, scale=3.0) * torch.logspace(-4, 2, k + 16)).to(dtype)[:, :k]  # strided
    x[0, :8] = 0.0  # zeros and a tie-rich row
    q, scales = quantize_activations(x)
    expected_q, expected_scales = quantize_activations_reference(x)
    assert q.dtype == FP8_DTYPE and scales.shape == (m, -(-k // 128))
    assert torch.equal(scales, expected_scales)
    assert torch.equal(q.float(), expected_q.float())  # +0 and -0 may differ in sign, not in value


def test_rounding_to_e4m3_is_to_nearest_even_at_every_value_and_midpoint():
    values = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).float()
    values = values[values.isfinite()].unique()
    midpoints = (values[1:] + values[:-1]) / 2
    cases = torch.cat([values, midpoints, -midpoints])
    cases = torch.nn.functional.pad(cases, (0, -cases.numel() % 127)).view(-1, 127)
    x = torch.cat([cases, torch.full((cases.shape[0], 1), 448.0)], dim=1)  # 448 sets each scale to 1
    q, scales = quantize_activations(x)
    assert torch.all(scales == 1.0)
    assert torch.equal(q.float(), x.to(FP8_DTYPE).float())


def test_rows_past_the_input_are_quantized_zeros_for_a_padded_gemm():
    x = random(3, 256, seed=2)
    q, scales = quantize_activations(x, column_major_scales=True, rows=16)
    assert q.shape == (16, 256) and scales.shape == (16, 2) and scales.stride() == (1, 16)
    expected_q, expected_scales = quantize_activations_reference(x)
    assert torch.equal(q[:3].float(), expected_q.float()) and torch.equal(scales[:3], expected_scales)
    assert torch.all(q[3:].float() == 0) and torch.all(scales[3:] > 0)


def test_scales_can_be_stored_column_major_for_scaled_mm():
    x = random(5, 384, seed=1)
    q, scales = quantize_activations(x, column_major_scales=True)
    assert scales.stride() == (1, 5)
    assert torch.equal(scales, quantize_activations_reference(x)[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k,rows,column_major",
                         [(1, 384, None, False), (5, 200, 16, True), (3, 1024, 3, True)])
def test_silu_mul_quantized_in_one_pass_equals_silu_mul_then_quantization(m, k, rows, column_major, dtype):
    gate_up = random(m, 2 * k, seed=k, scale=4.0).to(dtype)  # [gate | up], as the gate/up projection writes
    gate_up[0, :8] = 0.0
    q, scales = quantize_activations(gate_up, column_major_scales=column_major, rows=rows, silu_mul=True)
    expected_q, expected_scales = quantize_activations(silu_mul(gate_up, use_triton=True),
                                                       column_major_scales=column_major, rows=rows)
    assert q.shape == ((rows or m), k) and scales.stride() == expected_scales.stride()
    assert torch.equal(scales, expected_scales)
    assert torch.equal(q.float(), expected_q.float())
    reference_q, _ = quantize_activations_reference(silu_mul(gate_up, use_triton=True))
    assert torch.equal(q[:m].float(), reference_q.float())


# --- block-scaled GEMM ------------------------------------------------------------------------------


def gemm_inputs(m: int, n: int, k: int, seed: int):
    x = random(m, k, seed=seed, scale=2.0)
    weight, scale_inv = quantize_weight(random(n, k, seed=seed + 1, scale=0.05))
    return x, weight, scale_inv


@pytest.mark.parametrize("m", [1, 7, 64])
@pytest.mark.parametrize("n,k", [(256, 384), (384, 128), (200, 256), (256, 200)],
                         ids=["256x384", "384x128", "ragged-n", "ragged-k"])
def test_block_fp8_matmul_equals_the_dequantized_reference(m, n, k):
    x, weight, scale_inv = gemm_inputs(m, n, k, seed=m + n)
    q, scales = quantize_activations(x)
    out = block_fp8_matmul(q, scales, weight, scale_inv, torch.float32)
    expected = reference_matmul(x, weight, scale_inv)
    assert out.shape == (m, n) and out.dtype == torch.float32
    assert relative_error(out, expected) <= GEMM_RELATIVE_TOLERANCE


@pytest.mark.parametrize("m", [1, 7, 64])
@pytest.mark.parametrize("n,k", [(256, 384), (200, 200)], ids=["256x384", "ragged"])
def test_quantizing_inside_the_gemm_equals_quantizing_first_bit_for_bit(m, n, k):
    x, weight, scale_inv = gemm_inputs(m, n, k, seed=2 * m + n)
    q, scales = quantize_activations(x)
    for tiles in (matmul_tiles(m, n, k), MatmulTiles(16, 32, 2, 4, 2)):
        fused = block_fp8_matmul(x, None, weight, scale_inv, torch.float32, tiles)
        assert torch.equal(fused, block_fp8_matmul(q, scales, weight, scale_inv, torch.float32, tiles))


@pytest.mark.parametrize("tiles", [MatmulTiles(16, 32, 1, 4, 2), MatmulTiles(16, 64, 3, 4, 2),
                                   MatmulTiles(32, 128, 5, 4, 2)], ids=str)
def test_every_tile_shape_and_split_k_gives_the_reference(tiles):
    x, weight, scale_inv = gemm_inputs(9, 256, 640, seed=3)
    q, scales = quantize_activations(x)
    out = block_fp8_matmul(q, scales, weight, scale_inv, torch.float32, tiles)
    assert relative_error(out, reference_matmul(x, weight, scale_inv)) <= GEMM_RELATIVE_TOLERANCE


def test_half_precision_output_is_the_float32_result_rounded_once():
    x, weight, scale_inv = gemm_inputs(7, 256, 256, seed=5)
    q, scales = quantize_activations(x)
    full = block_fp8_matmul(q, scales, weight, scale_inv, torch.float32)
    half = block_fp8_matmul(q, scales, weight, scale_inv, torch.float16)
    assert half.dtype == torch.float16 and torch.equal(half, full.to(torch.float16))


def test_decode_shapes_split_k_and_prefill_shapes_do_not():
    decode = matmul_tiles(1, 5120, 17408, num_sms=132)
    assert decode.block_m == 16 and decode.split_k > 1
    prefill = matmul_tiles(8192, 5120, 17408, num_sms=132)
    assert prefill.block_m == 128 and prefill.split_k == 1
    assert all(128 % tiles.block_n == 0 for tiles in (decode, prefill))
