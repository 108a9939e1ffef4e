"""The 14B shape cut to two layers, and a prefill then eight decode steps of it: the model steps the
GPU tests compare with a switch on and off (dependent launch)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from plans import Chunk, make_plan

from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.runner import ModelRunner

BLOCK_SIZE = 16


def fourteen_b_runner(quantization: str | None) -> ModelRunner:
    model = ModelConfig.from_name("qwen3-14b", dtype="bfloat16", load_format="dummy")
    model = model.with_overrides(num_layers=2)
    if quantization:
        model = model.quantized_at_load(quantization)
    config = EngineConfig(model=model, cache=CacheConfig(block_size=BLOCK_SIZE),
                          scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=8),
                          device="cuda")
    return ModelRunner(config, num_pages=1024, show_progress=False)


def step_logits(runner: ModelRunner, batch: int, seed: int) -> list[torch.Tensor]:
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


def assert_same_logits_on_and_off(monkeypatch, variable: str, is_on: Callable[[], bool],
                                  reread: Callable[[], None], quantization: str | None) -> None:
    """With the environment `variable` "1" then "0" (`reread` makes its module read it again, `is_on`
    says what it now reads), a fresh runner each, the steps of `step_logits` at batches 1 and 4 give
    the same logits bit for bit."""
    results = {}
    for setting in ("1", "0"):
        monkeypatch.setenv(variable, setting)
        reread()
        assert is_on() == (setting == "1"), f"{variable}={setting} not taken"
        runner = fourteen_b_runner(quantization)
        results[setting] = [step_logits(runner, batch, seed=batch) for batch in (1, 4)]
        del runner
        torch.cuda.empty_cache()
    monkeypatch.delenv(variable)
    reread()
    for batch, on, off in zip((1, 4), results["1"], results["0"]):
        for step, (a, b) in enumerate(zip(on, off)):
            assert torch.equal(a, b), f"batch {batch}, step {step}: logits differ with {variable} 1 and 0"
