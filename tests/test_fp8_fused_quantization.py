"""The activation quantization fused into the kernel before an FP8 product (fused.py with `quantize`,
core/execution/model/quantized_activations.py): bit for bit what `quantize_activations` makes of the
unfused kernel's output, in the layout each GEMM asks for, and the same logits through the model.

On the CPU through the Triton interpreter (float32 and float16: the interpreter truncates float32
to bfloat16, see tests/test_fused_ops.py); bfloat16 on the GPU in tests/gpu/test_gpu_fp8.py.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from plans import Chunk, make_plan  # noqa: E402
from triton_interpreter import is_interpreted, run_in_fresh_interpreter, skip_unless_interpreted  # noqa: E402

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]')")

from core.config import CacheConfig, EngineConfig, ModelConfig  # noqa: E402
from core.execution.model import fp8_gemm, fused  # noqa: E402
from core.execution.model.fp8_format import quantize_activations_reference, quantize_weight  # noqa: E402
from core.execution.model.fp8_gemm import (  # noqa: E402
    SCALED_MM_LAYOUT,
    TRITON_LAYOUT,
    activation_layout,
    triton_gemm,
)
from core.execution.model.fp8_kernels import quantize_activations  # noqa: E402
from core.execution.model.fp8_linear import Fp8LinearMethod  # noqa: E402
from core.execution.model.quantized_activations import QuantizedActivations, quantize_reference  # noqa: E402
from core.execution.runner import ModelRunner  # noqa: E402

INTERPRETED = is_interpreted(triton.language.zeros, fused._silu_mul_kernel)
LAYOUTS = {"triton": TRITON_LAYOUT, "scaled_mm": SCALED_MM_LAYOUT}


@pytest.fixture(autouse=True)
def _kernels_run_here_or_in_the_child(request):
    skip_unless_interpreted(request, INTERPRETED)


def test_kernels_in_a_fresh_interpreter():
    run_in_fresh_interpreter(__file__, INTERPRETED)


def random(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # groups of unlike ranges, as a model's activations have
    return (scale * torch.randn(*shape, generator=generator) * torch.logspace(-2, 1, shape[-1])).to(dtype)


def assert_quantized_as(got: QuantizedActivations, unfused: torch.Tensor, layout) -> None:
    """`got` holds exactly quantize_activations(unfused), in `layout`."""
    m = unfused.shape[0]
    q, scales = quantize_activations(unfused, column_major_scales=layout.column_major_scales)
    assert got.rows == m and got.dtype == unfused.dtype
    assert got.q.shape[0] % layout.rows_multiple == 0 and got.q.shape[0] >= m
    padded, groups = got.scales.shape
    assert got.scales.stride() == ((1, padded) if layout.column_major_scales else (groups, 1))
    assert torch.equal(got.q[:m].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(got.scales[:m], scales)


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("num_tokens,size", [(1, 256), (5, 320), (17, 128)])
def test_a_quantizing_norm_writes_what_quantizing_its_output_gives(layout, dtype, num_tokens, size):
    x = random(num_tokens, size, dtype=dtype, seed=size + num_tokens)
    residual = random(num_tokens, size, dtype=dtype, seed=7)
    weight = (1.0 + 0.2 * torch.randn(size, generator=torch.Generator().manual_seed(3))).to(dtype)
    normed, new_residual = fused.add_rms_norm(x, residual, weight, 1e-6, use_triton=True)
    quantized, quantized_residual = fused.add_rms_norm(x, residual, weight, 1e-6, use_triton=True,
                                                       quantize=LAYOUTS[layout])
    assert torch.equal(quantized_residual, new_residual)
    assert_quantized_as(quantized, normed, LAYOUTS[layout])
    alone = fused.rms_norm(x, weight, 1e-6, use_triton=True, quantize=LAYOUTS[layout])
    assert_quantized_as(alone, fused.rms_norm(x, weight, 1e-6, use_triton=True), LAYOUTS[layout])


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("num_tokens,size", [(1, 384), (3, 1100), (16, 2048)])
def test_a_quantizing_silu_mul_writes_what_quantizing_its_output_gives(layout, dtype, num_tokens, size):
    gate_up = random(num_tokens, 2 * size, dtype=dtype, seed=size)
    quantized = fused.silu_mul(gate_up, use_triton=True, quantize=LAYOUTS[layout])
    assert_quantized_as(quantized, fused.silu_mul(gate_up, use_triton=True), LAYOUTS[layout])


def test_the_torch_path_quantizes_by_the_definition():
    x = random(3, 256, dtype=torch.float32, seed=1)
    weight = torch.full((256,), 1.1)
    quantized = fused.rms_norm(x, weight, 1e-6, use_triton=False, quantize=SCALED_MM_LAYOUT)
    q, scales = quantize_activations_reference(fused.rms_norm(x, weight, 1e-6, use_triton=False))
    assert quantized.q.shape == (16, 256) and quantized.scales.stride() == (1, 16)
    assert torch.equal(quantized.q[:3].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(quantized.scales[:3], scales)


@pytest.mark.parametrize("m", [1, 3, 9, 20])
def test_the_triton_gemm_takes_quantized_activations_for_the_same_product(m):
    x = random(m, 384, dtype=torch.float32, seed=m)
    generator = torch.Generator().manual_seed(m)
    weight, scale_inv = quantize_weight(0.05 * torch.randn(256, 384, generator=generator))
    expected = triton_gemm(x, weight, scale_inv)
    got = triton_gemm(quantize_reference(x, TRITON_LAYOUT), weight, scale_inv)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("m", [1, 3])
def test_the_row_gemv_takes_quantized_activations_for_the_same_product(m):
    x = random(m, 384, dtype=torch.float32, seed=m)
    generator = torch.Generator().manual_seed(m)
    weight, scale_inv = quantize_weight(0.05 * torch.randn(256, 384, generator=generator))
    expected = fp8_gemm.row_gemv_gemm(x, weight, scale_inv)
    got = fp8_gemm.row_gemv_gemm(quantize_reference(x, TRITON_LAYOUT), weight, scale_inv)
    assert torch.equal(got, expected)


def test_each_gemm_names_the_layout_it_wants():
    weight, scale_inv = quantize_weight(torch.randn(256, 512))
    assert activation_layout(fp8_gemm.triton_gemm, 7, weight, scale_inv) == TRITON_LAYOUT
    assert activation_layout(fp8_gemm.scaled_mm_gemm, 7, weight, scale_inv) == SCALED_MM_LAYOUT
    assert activation_layout(fp8_gemm.mixed_gemm, 7, weight, scale_inv) == SCALED_MM_LAYOUT
    assert activation_layout(fp8_gemm.dequant_gemm, 7, weight, scale_inv) is None  # weight-only
    assert activation_layout(lambda x, w, s: x, 7, weight, scale_inv) is None  # a GEMM it does not know
    # K in 3 blocks: scaled_mm hands the product to the Triton GEMM, and so gets its layout
    narrow_weight, narrow_scales = quantize_weight(torch.randn(256, 384))
    assert activation_layout(fp8_gemm.scaled_mm_gemm, 7, narrow_weight, narrow_scales) == TRITON_LAYOUT
    # one row of a gate/up-wide product: mixed takes the GEMV
    wide, wide_scales = torch.empty(34816, 512, dtype=weight.dtype), torch.empty(272, 4)
    assert activation_layout(fp8_gemm.mixed_gemm, 1, wide, wide_scales) == TRITON_LAYOUT
    assert activation_layout(fp8_gemm.mixed_gemm, 2, wide, wide_scales) == SCALED_MM_LAYOUT
    # the row GEMV up to its few rows, scaled_mm above
    assert activation_layout(fp8_gemm.row_gemv_gemm, 4, weight, scale_inv) == TRITON_LAYOUT
    assert activation_layout(fp8_gemm.row_gemv_gemm, 5, weight, scale_inv) == SCALED_MM_LAYOUT


def tiny_fp8_runner() -> ModelRunner:
    model = ModelConfig.from_name("qwen3-tiny", dtype="float32").quantized_at_load("fp8")
    config = EngineConfig(model=model, cache=CacheConfig(block_size=16, num_pages=32))
    return ModelRunner(config, show_progress=False)


def test_the_model_with_quantizing_norms_and_silu_gives_the_same_logits(monkeypatch):
    """qwen3-tiny in FP8 with the Triton GEMM (in the interpreter): the norms and SiLU * up quantize
    for q/k/v, gate/up and down, o_proj quantizes its own input; against every layer quantizing its
    own input (input_layout None), the logits of a prefill and a decode step are identical."""
    runner = tiny_fp8_runner()
    method = runner.model.model.layers[0].mlp.down_proj.linear_method
    assert isinstance(method, Fp8LinearMethod)
    method.gemm = triton_gemm  # the CPU's choice is dequant, which takes unquantized input
    prompt = np.random.default_rng(0).integers(0, 512, size=21).tolist()
    plans = [make_plan([Chunk(prompt, 0, [3, 0])], 16),
             make_plan([Chunk([5], len(prompt), [3, 0])], 16, step_id=1)]
    seen = []
    layout_of = Fp8LinearMethod.input_layout
    monkeypatch.setattr(Fp8LinearMethod, "input_layout",
                        lambda self, layer, n: seen.append(layout_of(self, layer, n)) or seen[-1])
    fused_logits = [runner.forward_logits(plan)[0].clone() for plan in plans]
    assert seen and all(layout == TRITON_LAYOUT for layout in seen)
    assert len(seen) == 2 * 3 * runner.config.model.num_layers  # q/k/v, gate/up, down per layer and step
    monkeypatch.setattr(Fp8LinearMethod, "input_layout", lambda self, layer, n: None)
    unfused_logits = [runner.forward_logits(plan)[0].clone() for plan in plans]
    for fused_step, unfused_step in zip(fused_logits, unfused_logits):
        assert torch.equal(fused_step, unfused_step)
