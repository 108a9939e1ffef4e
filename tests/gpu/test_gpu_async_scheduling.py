"""Async scheduling on the GPU: placeholders filled on the device give the tokens of one step at a time.

Both servers run the qwen3-tiny preset in float32 with CUDA graphs; with ignore_eos the two plan the
same batches, so greedy and seeded tokens must be identical, token for token.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from system_client import SystemClient, tiny_config

from core.config import ModelConfig
from core.sampling_params import SamplingParams
from procs.launcher import Launcher, LaunchOptions


def _tokens(async_scheduling: bool) -> dict[str, list[int]]:
    config = tiny_config(max_num_batched_tokens=512)
    config = dataclasses.replace(
        config, device="cuda", model=ModelConfig.from_name("qwen3-tiny", dtype="float32"),
        scheduler=dataclasses.replace(config.scheduler, async_scheduling=async_scheduling))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 151_000, n).tolist() for n in (1, 7, 16, 33, 200)]
    runs = {"greedy": SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
            "seeded": SamplingParams(max_tokens=24, temperature=1.0, seed=5, ignore_eos=True)}
    results = {}
    with Launcher(config, LaunchOptions(startup_timeout_s=300)) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        for name, params in runs.items():
            batch = {f"{name}-{i}": {"prompt_token_ids": ids} for i, ids in enumerate(prompts)}
            for key, result in client.generate(batch, params).items():
                assert result.error is None and len(result.token_ids) == 24, result
                results[key] = result.token_ids
    return results


def test_async_scheduling_reproduces_one_step_at_a_time_on_cuda():
    assert _tokens(async_scheduling=True) == _tokens(async_scheduling=False)
