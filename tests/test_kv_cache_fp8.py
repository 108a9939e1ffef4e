"""`--kv-cache-dtype fp8` on the CPU: the pool holds fp8 pages (so as many more tokens as the model's
dtype is wider), the model's logits over them stay within fp8's rounding of the exact cache's, and a
server serves with it end to end, prefix cache included. The kernels are checked against the
reference in tests/test_triton_attention_fp8.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from plans import Chunk, make_plan
from system_client import GREEDY, SystemClient, tiny_config

from core.config import CacheConfig, ConfigError, EngineConfig, ModelConfig
from core.execution.kv_cache import FP8_KV_DTYPE
from core.execution.runner import ModelRunner
from procs.launcher import Launcher, LaunchOptions

BLOCK_SIZE = 16
PROMPT = np.random.default_rng(5).integers(0, 500, size=45).tolist()


def runner(kv_cache_dtype: str) -> ModelRunner:
    model = ModelConfig.from_name("qwen3-tiny", dtype="float32")
    cache = CacheConfig(block_size=BLOCK_SIZE, kv_cache_dtype=kv_cache_dtype)
    return ModelRunner(EngineConfig(model=model, cache=cache), show_progress=False)


def greedy_logits(runner: ModelRunner, steps: int = 5) -> list[torch.Tensor]:
    pages = [2, 7, 4, 9]
    plan = make_plan([Chunk(PROMPT, 0, pages)], BLOCK_SIZE)
    out = []
    for step in range(steps):
        logits, _ = runner.forward_logits(plan)
        out.append(logits[0])
        token = int(logits[0].argmax())
        plan = make_plan([Chunk([token], len(PROMPT) + step, pages)], BLOCK_SIZE, step_id=step + 1)
    return out


def test_fp8_pages_hold_four_times_the_tokens_of_float32_ones_in_the_same_memory():
    exact, fp8 = runner("auto"), runner("fp8")
    assert fp8.kv_cache.storage.dtype == FP8_KV_DTYPE and exact.kv_cache.storage.dtype == torch.float32
    assert fp8.num_pages == 4 * exact.num_pages
    assert fp8.kv_cache.nbytes == exact.kv_cache.nbytes


def test_logits_over_fp8_pages_stay_within_its_rounding_of_the_exact_cache():
    exact, fp8 = greedy_logits(runner("auto")), greedy_logits(runner("fp8_e4m3"))
    for step, (ours, theirs) in enumerate(zip(fp8, exact)):
        relative = float((ours - theirs).abs().max() / theirs.abs().max())
        assert relative < 0.05, f"step {step}: logits {relative:.2%} from the exact cache's"
    assert any(not torch.equal(ours, theirs) for ours, theirs in zip(fp8, exact))  # it is rounded


def test_an_unknown_kv_cache_dtype_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match="kv_cache_dtype must be one of auto, fp8, fp8_e4m3, got 'int8'"):
        CacheConfig(kv_cache_dtype="int8")


def test_a_server_with_an_fp8_kv_cache_serves_and_hits_its_prefix_cache():
    config = tiny_config(num_pages=128)
    config = dataclasses.replace(config, cache=dataclasses.replace(config.cache, kv_cache_dtype="fp8"))
    prompts = {f"p{i}": {"prompt": "the same long system prompt, " * 8 + f"question {i}"} for i in range(4)}
    with Launcher(config, LaunchOptions(startup_timeout_s=120)) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        first = client.generate(prompts, GREEDY)
        again = client.generate({"p0-again": prompts["p0"]}, GREEDY)["p0-again"]
    assert all(r.failed is None and r.error is None and len(r.token_ids) == GREEDY.max_tokens
               for r in first.values())
    assert again.token_ids == first["p0"].token_ids and again.num_cached_tokens >= 16
