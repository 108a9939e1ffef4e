"""An FP8 model's attention quantizing o_proj's input (core/execution/quantized_input.py) changes where
the quantization happens, never its values: the 14B shape (two layers) gives the same logits bit for
bit with it on and off (CADENCE_QUANTIZE_IN_ATTENTION), on the GEMM the device serves by default and
on the Triton one, over fresh prompts, a chunk after a cached prefix, a mixed step and decode steps
replayed from CUDA graphs (one and four rows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from plans import Chunk, make_plan

from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.model.fp8_linear import QUANTIZE_AHEAD_ENV, Fp8LinearMethod
from core.execution.runner import ModelRunner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
BLOCK_SIZE = 16


def _runner() -> ModelRunner:
    model = ModelConfig.from_name("qwen3-14b", dtype="bfloat16", load_format="dummy")
    model = model.with_overrides(num_layers=2).quantized_at_load("fp8")
    config = EngineConfig(model=model, cache=CacheConfig(block_size=BLOCK_SIZE),
                          scheduler=SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=8),
                          device="cuda")
    return ModelRunner(config, num_pages=1024, show_progress=False)


def _plans() -> list:
    rng = np.random.default_rng(0)
    lengths = (1784, 300, 17, 700)
    prompts = [rng.integers(0, 151_000, n).tolist() for n in lengths]
    pages = [list(range(i * 192, i * 192 + 192)) for i in range(4)]  # 3,072 tokens each
    plans = [
        make_plan([Chunk(prompts[0], 0, pages[0])], BLOCK_SIZE, step_id=0),  # one long fresh prompt
        make_plan([Chunk(prompts[1], 0, pages[1]), Chunk(prompts[2], 0, pages[2])], BLOCK_SIZE, step_id=1),
        make_plan([Chunk(prompts[3], 1784, pages[0])], BLOCK_SIZE, step_id=2),  # after a cached prefix
        make_plan([Chunk([5], 300, pages[1]), Chunk(prompts[3][:64], 0, pages[3])], BLOCK_SIZE, step_id=3),
    ]
    contexts = [2484, 301, 17, 64]
    for step in range(4, 8):  # decodes, graph-replayed: request 0 alone, then all four
        rows = [0] if step < 6 else [0, 1, 2, 3]
        plans.append(make_plan([Chunk([int(rng.integers(0, 151_000))], contexts[r], pages[r]) for r in rows],
                               BLOCK_SIZE, step_id=step))
        for r in rows:
            contexts[r] += 1
    return plans


@pytest.mark.parametrize("gemm", ["auto", "triton"])
def test_logits_are_the_same_with_the_attention_quantizing_or_not(gemm, monkeypatch):
    monkeypatch.setenv("CADENCE_FP8_GEMM", gemm)
    logits = {}
    for setting in ("1", "0"):
        monkeypatch.setenv(QUANTIZE_AHEAD_ENV, setting)
        runner = _runner()
        methods = {m.linear_method for m in runner.model.modules()
                   if isinstance(getattr(m, "linear_method", None), Fp8LinearMethod)}
        assert [m.takes_quantized_input for m in methods] == [setting == "1"]
        plans = _plans()
        assert runner.graphs is not None and all(runner.graphs.can_run(p) for p in plans[4:])
        logits[setting] = [runner.forward_logits(plan)[0].clone() for plan in plans]
        torch.cuda.synchronize()
        del runner
        torch.cuda.empty_cache()
    for step, (fused, separate) in enumerate(zip(logits["1"], logits["0"])):
        assert torch.isfinite(fused).all()
        assert torch.equal(fused, separate), f"step {step}: logits differ with the attention quantizing"
