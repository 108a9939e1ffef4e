"""Programmatic dependent launch changes when the decode step's kernels start, never what they
compute: the 14B shape (two layers) in bf16 and in FP8, decode graphs and a prefill, gives the same
logits bit for bit with CADENCE_PDL on and off. A kernel that read its predecessor's output before
the predecessor finished (a missing gdc_wait) would show here as a difference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from plans import Chunk, make_plan

from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution import dependent_launch
from core.execution.runner import ModelRunner

BLOCK_SIZE = 16


def _runner(quantization: str | None) -> ModelRunner:
    model = ModelConfig.from_name("qwen3-14b", dtype="bfloat16", load_format="dummy")
    model = model.with_overrides(num_layers=2)
    if quantization:
        model = model.quantized_at_load(quantization)
    config = EngineConfig(model=model, cache=CacheConfig(block_size=BLOCK_SIZE),
                          scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=8),
                          device="cuda")
    return ModelRunner(config, num_pages=1024, show_progress=False)


def _step_logits(runner: ModelRunner, batch: int, seed: int) -> list[torch.Tensor]:
    """A prefill of `batch` prompts, then eight decode steps (CUDA graphs), every step's logits."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(200, 900, batch)
    pages = [list(range(i * 64, i * 64 + 64)) for i in range(batch)]  # 1,024 tokens each at most
    prompts = [rng.integers(0, 151_000, n).tolist() for n in lengths]
    plans = [make_plan([Chunk(p, 0, pg) for p, pg in zip(prompts, pages)], BLOCK_SIZE, step_id=0)]
    for step in range(1, 9):
        plans.append(make_plan([Chunk([int(rng.integers(0, 151_000))], int(n) + step - 1, pg)
                                for n, pg in zip(lengths, pages)], BLOCK_SIZE, step_id=step))
    assert runner.graphs is not None and all(runner.graphs.can_run(p) for p in plans[1:])
    return [runner.forward_logits(plan)[0].clone() for plan in plans]


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_logits_are_the_same_with_and_without_dependent_launch(quantization, monkeypatch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    results = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("CADENCE_PDL", setting)
        dependent_launch.reread_environment()
        assert dependent_launch.dependent_launch(torch.device("cuda")) == (setting == "1")
        runner = _runner(quantization)
        results[setting] = [_step_logits(runner, batch, seed=batch) for batch in (1, 4)]
        del runner
        torch.cuda.empty_cache()
    dependent_launch.reread_environment()
    for batch, on, off in zip((1, 4), results["1"], results["0"]):
        for step, (a, b) in enumerate(zip(on, off)):
            assert torch.equal(a, b), f"batch {batch}, step {step}: logits differ with PDL on and off"
