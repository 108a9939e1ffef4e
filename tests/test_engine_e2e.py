"""End to end on a tiny Qwen3 in float32 on the CPU: scheduler + runner + model, one process.

Greedy outputs must not depend on batching, chunking, preemption, block size or the prefix cache.
"""

from __future__ import annotations

import numpy as np
import pytest
from inprocess_engine import Engine
from tiny_models import build_tiny_checkpoint

from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.runner import ModelRunner
from core.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-qwen3")
    build_tiny_checkpoint(directory, seed=11)
    return directory


def make_engine(checkpoint, block_size=16, num_pages=256, prefix_cache=True, budget=2048,
                max_num_seqs=64) -> Engine:
    config = EngineConfig(
        model=ModelConfig.from_pretrained(checkpoint, dtype="float32"),
        cache=CacheConfig(block_size=block_size, num_pages=num_pages, enable_prefix_caching=prefix_cache),
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                  max_model_len=512),
    )
    return Engine(config, ModelRunner(config, show_progress=False))


def tokens_of(completions) -> list[list[int]]:
    return [c.token_ids for c in completions]


def assert_pool_balanced(engine: Engine) -> None:
    pool = engine.scheduler.pool
    pool.check()
    engine.scheduler.cache.check()
    assert pool.num_owned == 0, f"{pool.num_owned} pages still owned after every request finished"


def random_prompts(n: int, seed: int, shared_prefix: list[int] | None = None) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    prefix = shared_prefix or []
    return [prefix + rng.integers(0, 256, size=int(rng.integers(1, 60))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(64, seed=0)


@pytest.fixture(scope="module")
def alone(checkpoint, prompts):
    engine = make_engine(checkpoint, prefix_cache=False)
    results = [engine.generate([p], GREEDY)[0].token_ids for p in prompts]
    assert_pool_balanced(engine)
    return results


def test_greedy_outputs_equal_alone_and_64_at_once(checkpoint, prompts, alone):
    engine = make_engine(checkpoint, prefix_cache=False)
    completions = engine.generate(prompts, GREEDY)
    assert tokens_of(completions) == alone
    assert all(c.finish_reason == "length" and len(c.token_ids) == 8 for c in completions)
    assert_pool_balanced(engine)


def test_prefix_cache_cold_and_hot_give_the_same_tokens_and_hot_counts_hits(checkpoint):
    shared = list(range(100, 148))  # three full pages of block size 16
    prompts = random_prompts(12, seed=1, shared_prefix=shared)
    off = tokens_of(make_engine(checkpoint, prefix_cache=False).generate(prompts, GREEDY))
    engine = make_engine(checkpoint, prefix_cache=True)
    cold = engine.generate(prompts, GREEDY)
    hits_after_cold = engine.scheduler.stats().prefix_cache_hit_tokens
    hot = engine.generate(prompts, GREEDY)
    stats = engine.scheduler.stats()
    assert tokens_of(cold) == off
    assert tokens_of(hot) == off
    assert stats.prefix_cache_hit_tokens > hits_after_cold
    assert all(c.num_cached_tokens >= len(shared) for c in hot)
    assert_pool_balanced(engine)


def test_full_prompt_hit_gives_the_same_first_token(checkpoint):
    prompt = list(range(64))  # exactly four pages: a full-prompt hit on the second run
    engine = make_engine(checkpoint)
    first = engine.generate([prompt], GREEDY)[0]
    second = engine.generate([prompt], GREEDY)[0]
    assert second.token_ids == first.token_ids
    assert second.num_cached_tokens == 48  # the last page is recomputed so the last token runs
    assert_pool_balanced(engine)


def test_chunked_prefill_with_a_budget_of_7_tokens_gives_the_same_tokens(checkpoint, prompts, alone):
    engine = make_engine(checkpoint, prefix_cache=False, budget=7)
    assert tokens_of(engine.generate(prompts[:16], GREEDY)) == alone[:16]
    assert_pool_balanced(engine)


def test_forced_preemption_gives_the_same_tokens(checkpoint, prompts, alone):
    engine = make_engine(checkpoint, num_pages=12, prefix_cache=True)
    completions = engine.generate(prompts[:24], GREEDY)
    assert engine.scheduler.stats().num_preemptions > 0, "the small pool was meant to force preemption"
    assert tokens_of(completions) == alone[:24]
    assert_pool_balanced(engine)


@pytest.mark.parametrize("block_size", [1, 16])
def test_block_sizes_give_the_same_tokens(checkpoint, prompts, alone, block_size):
    engine = make_engine(checkpoint, block_size=block_size, num_pages=4096 // block_size)
    assert tokens_of(engine.generate(prompts[:16], GREEDY)) == alone[:16]
    assert_pool_balanced(engine)


def test_a_failing_step_fails_its_requests_and_the_engine_keeps_serving(checkpoint, prompts, alone):
    engine = make_engine(checkpoint, prefix_cache=False)
    real_execute = engine.runner.execute
    engine.runner.execute = lambda plan: (_ for _ in ()).throw(RuntimeError("device fell over"))
    failed = engine.generate(prompts[:3], GREEDY)
    assert all(c.finish_reason == "abort" and "device fell over" in c.error for c in failed)
    engine.runner.execute = real_execute
    assert tokens_of(engine.generate(prompts[:3], GREEDY)) == alone[:3]
    assert_pool_balanced(engine)


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(checkpoint, prompts):
    params = SamplingParams(max_tokens=6, temperature=0.8, top_p=0.9, seed=1234)
    engine = make_engine(checkpoint, prefix_cache=False)
    alone_tokens = engine.generate([prompts[5]], params)[0].token_ids
    batch = engine.generate(prompts[:10], [GREEDY] * 5 + [params] + [GREEDY] * 4)
    assert batch[5].token_ids == alone_tokens
