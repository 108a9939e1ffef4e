"""CUDA graphs of the decode step give the eager path's logits, padded batch sizes included."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from plans import Chunk, make_plan

from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.runner import ModelRunner

BLOCK_SIZE = 16


def _runner(enforce_eager: bool, small_step_graphs: bool = False) -> ModelRunner:
    config = EngineConfig(model=ModelConfig.from_name("qwen3-tiny", dtype="float32"),
                          cache=CacheConfig(block_size=BLOCK_SIZE, num_pages=2048),
                          scheduler=SchedulerConfig(max_model_len=1024, max_num_seqs=40), device="cuda",
                          enforce_eager=enforce_eager, small_step_graphs=small_step_graphs)
    return ModelRunner(config, show_progress=False)


def _steps(batch: int, rng: np.random.Generator):
    """A prefill of `batch` requests of different lengths, then six decode steps."""
    lengths = rng.integers(1, 300, batch)
    pages = [list(range(i * 30, i * 30 + 30)) for i in range(batch)]  # 480 tokens each at most
    prompts = [rng.integers(0, 150_000, n).tolist() for n in lengths]
    yield make_plan([Chunk(p, 0, pg) for p, pg in zip(prompts, pages)], BLOCK_SIZE, step_id=0)
    for step in range(1, 7):
        chunks = [Chunk([int(rng.integers(0, 150_000))], int(n) + step - 1, pg)
                  for n, pg in zip(lengths, pages)]
        yield make_plan(chunks, BLOCK_SIZE, step_id=step)


@pytest.mark.parametrize("batch", [1, 3, 17, 40])
def test_graph_decode_logits_equal_eager(batch):
    graphs, eager = _runner(False), _runner(True)
    assert graphs.graphs is not None and eager.graphs is None
    plans = list(_steps(batch, np.random.default_rng(batch)))
    for plan in plans:
        assert (plan.num_tokens == plan.num_reqs) == graphs.graphs.can_run(plan)
        ours, _ = graphs.forward_logits(plan)
        theirs, _ = eager.forward_logits(plan)
        error = float((ours - theirs).abs().max() / theirs.abs().max())
        assert error < 1e-4, f"step {plan.step_id}, batch {batch}: graph logits differ by {error:.2e}"


def test_graph_padding_writes_no_kv():
    runner = _runner(False)
    before = runner.kv_cache.storage.clone()
    plan = next(s for s in _steps(3, np.random.default_rng(0)) if s.num_tokens == s.num_reqs)
    plan = dataclasses.replace(plan, kv_index=np.full(3, -1, np.int64))  # this step writes nothing
    runner.forward_logits(plan)
    torch.cuda.synchronize()
    assert torch.equal(before, runner.kv_cache.storage), "a padded graph row wrote into the KV cache"


def test_small_steps_replayed_as_token_rows_give_the_eager_logits():
    """--small-step-graphs: prompts of up to 40 tokens, cached prefixes and decodes beside them replay
    the decode graph of their token count, one row per token (core/execution/token_rows.py)."""
    rows, eager = _runner(False, small_step_graphs=True), _runner(True)
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, 150_000, 300).tolist()
    warm = make_plan([Chunk(prompt[:288], 0, list(range(30))), Chunk(prompt[:7], 0, [40])], BLOCK_SIZE)
    steps = [  # a 12-token prompt; 12 new tokens after 288 cached with a decode beside them; 3 decodes
        make_plan([Chunk(prompt[100:112], 0, [50])], BLOCK_SIZE, step_id=1),
        make_plan([Chunk(prompt[288:300], 288, list(range(30))), Chunk([5], 7, [40])], BLOCK_SIZE, step_id=2),
        make_plan([Chunk([7], 300, list(range(30))), Chunk([8], 8, [40]), Chunk([9], 12, [50])], BLOCK_SIZE,
                  step_id=3),
    ]
    for runner in (rows, eager):
        runner.forward_logits(warm)
    for plan in steps:
        ours, _ = rows.forward_logits(plan)
        theirs, _ = eager.forward_logits(plan)
        error = float((ours - theirs).abs().max() / theirs.abs().max())
        assert error < 1e-4, f"step {plan.step_id}: token-row graph logits differ by {error:.2e}"
