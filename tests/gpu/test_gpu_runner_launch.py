"""ModelRunner.launch on CUDA queues a step without waiting for the GPU, and placeholders come right.

Async scheduling only pays if launching step N+1 returns while step N still runs: any host copy from
pageable memory or any device-to-host read inside `launch` would make it wait. A long sleep kernel
keeps the GPU busy while a prefill and then a decode with placeholder inputs are launched behind it.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch
from plans import Chunk, make_plan
from tiny_models import build_tiny_checkpoint

from core.config import CacheConfig, EngineConfig, ModelConfig
from core.execution.runner import ModelRunner

BLOCK = 16


@pytest.mark.parametrize("eager", [False, True], ids=["decode-graph", "eager"])
def test_launch_returns_while_the_gpu_is_busy_and_fills_placeholders(tmp_path, eager):
    build_tiny_checkpoint(tmp_path, seed=3)
    config = EngineConfig(model=ModelConfig.from_pretrained(tmp_path, dtype="float32"),
                          cache=CacheConfig(block_size=BLOCK, num_pages=64), device="cuda",
                          enforce_eager=eager)
    runner = ModelRunner(config, show_progress=False)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, 20).tolist(), rng.integers(0, 256, 9).tolist()]
    pages = [[0, 1], [2]]
    prefill = make_plan([Chunk(p, 0, pg) for p, pg in zip(prompts, pages)], BLOCK, step_id=0)

    # One step at a time: the tokens to reproduce.
    first = runner.execute(prefill).sampled_token_ids.tolist()
    decode = make_plan([Chunk([t], len(p), pg) for t, p, pg in zip(first, prompts, pages)], BLOCK, step_id=1)
    second = runner.execute(decode).sampled_token_ids.tolist()

    # Both steps launched behind a busy GPU; the decode's inputs are the prefill's samples.
    placeholders = dataclasses.replace(decode, input_ids=np.zeros(2, np.int32),
                                       prev_row=np.arange(2, dtype=np.int32))
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time
    start = time.perf_counter()
    launched_prefill = runner.launch(prefill)
    launched_decode = runner.launch(placeholders)
    launch_s = time.perf_counter() - start
    assert not launched_prefill.ready(), "the GPU finished its sleep already: the test proves nothing"
    assert launch_s < 0.3, f"launching two steps took {launch_s:.2f} s: something in launch waits for the GPU"
    assert runner.finish(launched_prefill).sampled_token_ids.tolist() == first
    assert runner.finish(launched_decode).sampled_token_ids.tolist() == second
