"""The attention kernels writing o_proj's FP8 input themselves (core/execution/quantized_input.py), on
the CPU through the Triton interpreter (see tests/triton_interpreter.py).

An FP8 model's attention quantizes its output per token and head (a head is 128 columns, one
activation group) as it writes it, instead of storing it for o_proj's GEMM to quantize in a pass of
its own. The values and scales must be those of that pass bit for bit, in both layouts the GEMMs
read (cuBLAS's padded rows with column-major scales, the Triton GEMM's row-major ones), from the
extend kernel (fresh prompts, cached prefixes) and the decode kernels (one split, several, a
graph's per-request splits); and an FP8 model's logits are the same bit for bit with it on and off.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import dataclasses  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from plans import Chunk, make_plan  # noqa: E402
from test_triton_attention import build_step  # noqa: E402
from tiny_models import tiny_fp8_model_config  # noqa: E402
from triton_interpreter import is_interpreted, run_in_fresh_interpreter, skip_unless_interpreted  # noqa: E402

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]')")

from core.config import CacheConfig, EngineConfig  # noqa: E402
from core.execution.attention import make_backend  # noqa: E402
from core.execution.attention.triton_backend import TritonAttention  # noqa: E402
from core.execution.attention.triton_extend import _extend_kernel  # noqa: E402
from core.execution.model import fp8_gemm  # noqa: E402
from core.execution.model.fp8_format import FP8_DTYPE  # noqa: E402
from core.execution.model.fp8_kernels import block_fp8_matmul, quantize_activations  # noqa: E402
from core.execution.model.fp8_linear import QUANTIZE_AHEAD_ENV, Fp8LinearMethod  # noqa: E402
from core.execution.model.layers import layers_quantize_their_input  # noqa: E402
from core.execution.quantized_input import QuantizedInput  # noqa: E402
from core.execution.runner import ModelRunner  # noqa: E402

INTERPRETED = is_interpreted(triton.language.zeros, _extend_kernel)
HEAD_DIM = 128  # one activation group a head
Q_HEADS, KV_HEADS, BLOCK_SIZE = 4, 2, 16


@pytest.fixture(autouse=True)
def _kernels_run_here_or_in_the_child(request):
    skip_unless_interpreted(request, INTERPRETED)


def test_kernels_in_a_fresh_interpreter():
    run_in_fresh_interpreter(__file__, INTERPRETED)


def empty_input(rows: int, num_tokens: int, column_major: bool) -> QuantizedInput:
    """Buffers as Fp8LinearMethod.quantized_input makes them: zero values, scales of one."""
    values = torch.zeros(rows, Q_HEADS * HEAD_DIM, dtype=FP8_DTYPE)
    scales = torch.ones(Q_HEADS, rows).t() if column_major else torch.ones(rows, Q_HEADS)
    return QuantizedInput(values, scales, num_tokens)


def assert_same_bits(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    as_int = torch.uint8 if got.dtype == FP8_DTYPE else torch.int32
    different = (got.contiguous().view(as_int) != expected.contiguous().view(as_int)).sum().item()
    assert different == 0, f"{what}: {different} of {got.numel()} differ"


STEPS = {
    "fresh": [(0, 21), (0, 7)],
    "cached-prefix": [(16, 21), (0, 9)],
    "long-chunk": [(40, 3), (5, 130)],
    "mixed": [(0, 21), (300, 1), (30, 1)],
    "split-decodes": [(300, 1), (40, 1)],  # 2 splits (the interpreter's 4 "SMs"), then the reduce kernel
    "direct-decodes": [(40, 1), (20, 1)],  # one split: the split kernel writes the output
}


# bf16 for every step; float32 (the CPU's dtype) for one.
CASES = [(torch.bfloat16, name) for name in STEPS] + [(torch.float32, "mixed")]


@pytest.mark.parametrize("column_major", [True, False], ids=["cublas-layout", "triton-layout"])
@pytest.mark.parametrize(("dtype", "name"), CASES, ids=[f"{str(d)[6:]}-{n}" for d, n in CASES])
def test_the_quantized_output_is_the_quantization_pass_of_the_stored_output(dtype, name, column_major):
    step = build_step(STEPS[name], BLOCK_SIZE, Q_HEADS, KV_HEADS, dtype=dtype, head_dim=HEAD_DIM,
                      seed=len(name))
    assert_quantized_like_the_separate_pass(step, column_major)


@pytest.mark.parametrize("column_major", [True, False], ids=["cublas-layout", "triton-layout"])
def test_a_graph_steps_decodes_are_quantized_too(column_major):
    """A CUDA graph's launch: each request splits its own context (per-request splits)."""
    step = build_step([(300, 1), (40, 1), (129, 1)], BLOCK_SIZE, Q_HEADS, KV_HEADS, dtype=torch.bfloat16,
                      head_dim=HEAD_DIM)
    assert_quantized_like_the_separate_pass(
        dataclasses.replace(step, meta=dataclasses.replace(step.meta, static_shapes=True)), column_major)


def assert_quantized_like_the_separate_pass(step, column_major: bool) -> None:
    num_tokens = step.q.shape[0]
    rows = -(-num_tokens // 16) * 16 if column_major else num_tokens
    backend = TritonAttention("cpu")
    caches = [(step.k_cache.clone(), step.v_cache.clone()) for _ in range(2)]
    out = backend.forward(step.q, step.k, step.v, *caches[0], step.meta, HEAD_DIM**-0.5)
    expected_values, expected_scales = quantize_activations(out.reshape(num_tokens, -1),
                                                            column_major_scales=column_major, rows=rows)
    into = empty_input(rows, num_tokens, column_major)
    assert backend.forward(step.q, step.k, step.v, *caches[1], step.meta, HEAD_DIM**-0.5,
                           quantize_into=into) is None
    assert_same_bits(into.values[:num_tokens], expected_values[:num_tokens], "values")
    assert_same_bits(into.scales[:num_tokens], expected_scales[:num_tokens], "scales")
    # The pages were written as in the ordinary path; the padded rows were left as they were made.
    torch.testing.assert_close(caches[1], caches[0], rtol=0, atol=0, equal_nan=True)
    assert (into.values[num_tokens:].float() == 0).all() and (into.scales[num_tokens:] == 1).all()


def test_only_the_triton_backend_writes_a_quantized_output():
    assert TritonAttention("cpu").quantizes_output
    assert not make_backend("reference", "cpu").quantizes_output


@pytest.mark.parametrize("gemm", ["triton", "scaled_mm"])
def test_an_fp8_models_logits_are_the_same_with_the_attention_quantizing(gemm, monkeypatch):
    """A step of prompts, a step of a prompt after a cached prefix, a mixed step, decodes of one
    and of three rows: the same logits bit for bit whether o_proj's input is quantized by attention
    or by o_proj's GEMM.
    scaled_mm: cuBLAS's layout (padded rows, column-major scales), multiplied by the Triton GEMM
    in cuBLAS's place, which the CPU does not have."""
    if gemm == "scaled_mm":
        monkeypatch.setattr(fp8_gemm, "_scaled_mm", lambda x_q, x_scales, weight, weight_scale_inv, dtype, m:
                            block_fp8_matmul(x_q[:m], x_scales[:m], weight, weight_scale_inv, dtype))
    config = EngineConfig(model=tiny_fp8_model_config(num_layers=1), device="cpu",  # the interpreter is slow
                          cache=CacheConfig(block_size=BLOCK_SIZE, num_pages=32))
    runner = ModelRunner(config, backend=make_backend("triton", "cpu"), show_progress=False)
    methods = {m.linear_method for m in runner.model.modules()
               if isinstance(getattr(m, "linear_method", None), Fp8LinearMethod)}
    assert len(methods) == 1
    method = methods.pop()
    method.gemm = fp8_gemm.FP8_GEMMS[gemm]
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 512, size=n).tolist() for n in (37, 18, 25)]
    plans = [make_plan([Chunk(prompts[0], 0, [1, 2, 3]), Chunk(prompts[1], 0, [4, 5])], BLOCK_SIZE),
             make_plan([Chunk(prompts[2], 37, [1, 2, 3, 6, 7])], BLOCK_SIZE, step_id=1),
             make_plan([Chunk([9], 18, [4, 5]), Chunk(prompts[0][:20], 0, [8, 9])], BLOCK_SIZE, step_id=2),
             make_plan([Chunk([11], 19, [4, 5])], BLOCK_SIZE, step_id=3),
             make_plan([Chunk([12], 20, [4, 5]), Chunk([13], 20, [8, 9]), Chunk([14], 62, [1, 2, 3, 6, 7])],
                       BLOCK_SIZE, step_id=4)]
    logits = {}
    for on in (True, False):
        method.takes_quantized_input = on
        method._input_buffers = None
        logits[on] = [runner.forward_logits(plan)[0].clone() for plan in plans]
        assert (method._input_buffers is not None) == on, "the steps of prompts took the other path"
    for step, (fused, separate) in enumerate(zip(logits[True], logits[False])):
        assert_same_bits(fused, separate, f"step {step}'s logits")


def test_the_attention_quantizes_o_projs_input_only_when_asked(monkeypatch):
    monkeypatch.delenv(QUANTIZE_AHEAD_ENV, raising=False)
    assert not Fp8LinearMethod(tiny_fp8_model_config()).takes_quantized_input
    monkeypatch.setenv(QUANTIZE_AHEAD_ENV, "1")
    assert Fp8LinearMethod(tiny_fp8_model_config()).takes_quantized_input


def test_the_warm_ups_second_pass_has_every_layer_quantize_its_own_input(monkeypatch):
    monkeypatch.setenv(QUANTIZE_AHEAD_ENV, "1")
    config = EngineConfig(model=tiny_fp8_model_config(), device="cpu",
                          cache=CacheConfig(block_size=16, num_pages=8))
    model = ModelRunner(config, show_progress=False).model
    methods = {m.linear_method for m in model.modules()
               if isinstance(getattr(m, "linear_method", None), Fp8LinearMethod)}
    with layers_quantize_their_input(model) as changed:
        assert changed and not any(m.takes_quantized_input for m in methods)
    assert all(m.takes_quantized_input for m in methods)
    monkeypatch.delenv(QUANTIZE_AHEAD_ENV)
    with layers_quantize_their_input(ModelRunner(config, show_progress=False).model) as changed:
        assert not changed
