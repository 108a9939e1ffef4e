"""An FP8 model's attention quantizing o_proj's input in a step of prompts (core/execution/quantized_input.py)
changes where the quantization happens, never its values: the 14B shape (two layers) gives the same
logits bit for bit with it on and off, with the GEMM the device serves by default and with the
Triton one, over fresh prompts, a chunk after a cached prefix and a mixed step (not quantized by
attention) between them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from plans import Chunk, make_plan

from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.model import fp8_gemm
from core.execution.model.fp8_linear import Fp8LinearMethod
from core.execution.runner import ModelRunner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    model = ModelConfig.from_name("qwen3-14b", dtype="bfloat16", load_format="dummy")
    model = model.with_overrides(num_layers=2).quantized_at_load("fp8")
    config = EngineConfig(model=model, cache=CacheConfig(block_size=BLOCK_SIZE),
                          scheduler=SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=8),
                          device="cuda")
    return ModelRunner(config, num_pages=1024, show_progress=False)


def fp8_method(runner: ModelRunner) -> Fp8LinearMethod:
    methods = {m.linear_method for m in runner.model.modules()
               if isinstance(getattr(m, "linear_method", None), Fp8LinearMethod)}
    assert len(methods) == 1
    return methods.pop()


def plans() -> list:
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 151_000, n).tolist() for n in (1784, 300, 17, 700)]
    pages = [list(range(i * 192, i * 192 + 192)) for i in range(4)]  # 3,072 tokens each
    return [
        make_plan([Chunk(prompts[0], 0, pages[0])], BLOCK_SIZE, step_id=0),  # one long fresh prompt
        make_plan([Chunk(prompts[1], 0, pages[1]), Chunk(prompts[2], 0, pages[2])], BLOCK_SIZE, step_id=1),
        make_plan([Chunk(prompts[3], 1784, pages[0])], BLOCK_SIZE, step_id=2),  # after a cached prefix
        make_plan([Chunk([5], 300, pages[1]), Chunk(prompts[3][:64], 0, pages[3])], BLOCK_SIZE, step_id=3),
    ]


@pytest.mark.parametrize("gemm", ["default", "triton"])
def test_logits_are_the_same_with_the_attention_quantizing_or_not(runner, gemm):
    method = fp8_method(runner)
    served = method.gemm
    if gemm == "triton":
        method.gemm = fp8_gemm.triton_gemm
    try:
        logits = {}
        for on in (True, False):
            method.takes_quantized_input = on
            method._input_buffers = None
            logits[on] = [runner.forward_logits(plan)[0].clone() for plan in plans()]
            torch.cuda.synchronize()
            assert (method._input_buffers is not None) == on
    finally:
        method.gemm, method.takes_quantized_input = served, True
    for step, (fused, separate) in enumerate(zip(logits[True], logits[False])):
        assert torch.isfinite(fused).all()
        assert torch.equal(fused, separate), f"step {step}: logits differ with the attention quantizing"
