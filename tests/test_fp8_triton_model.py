"""qwen3-tiny in FP8 through the Triton GEMMs, on the CPU in the Triton interpreter: the path a GPU
without cuBLAS's block-scaled GEMM serves, and at one row the row GEMV that the default serves on
every GPU (fp8_gemm.row_gemv_gemm and triton_gemm share it).

Each step's logits are compared with the same model multiplying by the format's definition
(`fp8_format.reference_matmul`: activations quantized per token and 128 columns, then a float32
product with the dequantized weight). A prefill takes the tensor-core GEMM, a decode step of one
row the row GEMV, of three rows the CUDA-core GEMV; a wrong scale, row or group moves logits by
far more than the bound, which leaves room for the last-bit differences of another summation order
that the activation quantization can turn into a step of one e4m3 value.
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
from core.execution.model import fp8_row_gemv  # noqa: E402
from core.execution.model.fp8_format import reference_matmul  # noqa: E402
from core.execution.model.fp8_gemm import triton_gemm  # noqa: E402
from core.execution.model.fp8_linear import Fp8LinearMethod  # noqa: E402
from core.execution.runner import ModelRunner  # noqa: E402

INTERPRETED = is_interpreted(triton.language.zeros, fp8_row_gemv._row_gemv_kernel)
BLOCK_SIZE = 16


@pytest.fixture(autouse=True)
def _kernels_run_here_or_in_the_child(request):
    skip_unless_interpreted(request, INTERPRETED)


def test_kernels_in_a_fresh_interpreter():
    run_in_fresh_interpreter(__file__, INTERPRETED)


def definition_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor) -> torch.Tensor:
    return reference_matmul(x, weight, weight_scale_inv)


def fp8_layers(runner: ModelRunner) -> list[Fp8LinearMethod]:
    methods = [m.linear_method for m in runner.model.modules()
               if isinstance(getattr(m, "linear_method", None), Fp8LinearMethod)]
    assert methods, "the FP8 model has no FP8 layers"
    return methods


def step_logits(runner: ModelRunner, gemm, plans) -> list[torch.Tensor]:
    for method in fp8_layers(runner):
        method.gemm = gemm
    return [runner.forward_logits(plan)[0].clone() for plan in plans]


def test_prefill_and_decodes_of_one_and_three_rows_track_the_definition():
    # Two of qwen3-tiny's four layers: every product kind, and a layer's output quantized as the next
    # layer's input, at half the interpreter's time.
    tiny = ModelConfig.from_name("qwen3-tiny", dtype="float32")
    model = tiny.with_overrides(num_layers=2).quantized_at_load("fp8")
    runner = ModelRunner(EngineConfig(model=model, cache=CacheConfig(block_size=BLOCK_SIZE, num_pages=64)),
                         show_progress=False)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 512, size=n).tolist() for n in (21, 9, 14)]
    pages = [[1, 2], [3], [4, 5]]
    prefill = make_plan([Chunk(p, 0, pg) for p, pg in zip(prompts, pages)], BLOCK_SIZE)
    one_row = make_plan([Chunk([5], len(prompts[0]), pages[0])], BLOCK_SIZE, step_id=1)
    after = [len(p) + (i == 0) for i, p in enumerate(prompts)]  # the first request decoded one token
    three_rows = make_plan([Chunk([7], start, pg) for start, pg in zip(after, pages)], BLOCK_SIZE, step_id=2)
    plans = [prefill, one_row, three_rows]
    expected = step_logits(runner, definition_gemm, plans)
    got = step_logits(runner, triton_gemm, plans)
    for name, ours, theirs in zip(("prefill", "one row", "three rows"), got, expected):
        error = float((ours - theirs).abs().max() / theirs.abs().max())
        print(f"{name}: max relative logit difference {error:.2e}")
        assert ours.shape == theirs.shape and error < 2e-2, (name, error)
