"""Prompt logprobs on the GPU: the scores of a long prompt (several slices of the LM head, copied
back through pinned memory after the step's event) equal a log-softmax over the whole prompt's
logits; in a served batch they leave the decode graphs and the other requests' tokens unchanged."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from inprocess_engine import Engine
from plans import Chunk, make_plan

from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.attention.backend import AttentionMetadata
from core.execution.host_to_device import to_device
from core.execution.runner import ModelRunner
from core.sampling_params import SamplingParams

BLOCK_SIZE = 16


def _config(budget: int = 2048) -> EngineConfig:
    return EngineConfig(model=ModelConfig.from_name("qwen3-tiny", dtype="float32"),
                        cache=CacheConfig(block_size=BLOCK_SIZE, num_pages=1024),
                        scheduler=SchedulerConfig(max_model_len=2048, max_num_seqs=16,
                                                  max_num_batched_tokens=budget), device="cuda")


@torch.inference_mode()
def _all_logprobs(runner: ModelRunner, plan) -> torch.Tensor:
    """log-softmax of every token row's logits, computed in one piece."""
    device = runner.device
    hidden = runner.model(to_device(plan.input_ids, device).long(), to_device(plan.positions, device).long(),
                          runner.kv_cache, runner.backend, AttentionMetadata.from_plan(plan, device))
    return torch.log_softmax(runner.model.compute_logits(hidden), dim=-1).cpu()


def test_long_prompt_scores_equal_a_whole_log_softmax():
    runner = ModelRunner(_config(), show_progress=False)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 150_000, 1001).tolist()
    plan = make_plan([Chunk(prompt[:1000], 0, list(range(63)), sample=False)], BLOCK_SIZE)
    plan = dataclasses.replace(plan, num_prompt_logprobs=np.array([4], np.int32),
                               next_prompt_id=np.array([prompt[1000]], np.int32))
    result = runner.finish(runner.launch(plan))
    expected = _all_logprobs(runner, plan)
    want = expected.gather(-1, torch.tensor(prompt[1:1001])[:, None]).squeeze(-1)
    np.testing.assert_allclose(result.prompt_logprobs, want.numpy(), atol=1e-4)
    top_values, _ = expected.topk(4, dim=-1)
    np.testing.assert_allclose(result.prompt_top_logprobs, top_values.numpy(), atol=1e-4)


def test_served_batch_keeps_graphed_decodes_and_other_outputs():
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 150_000, int(n)).tolist() for n in rng.integers(20, 400, 8)]
    plain = SamplingParams(max_tokens=12, temperature=0.0)
    scored = SamplingParams(max_tokens=12, temperature=0.0, prompt_logprobs=2)
    alone = Engine(_config(256), ModelRunner(_config(256), show_progress=False)).generate(prompts, plain)
    engine = Engine(_config(256), ModelRunner(_config(256), show_progress=False))
    assert engine.runner.graphs is not None
    mixed = engine.generate(prompts, [plain, scored] * 4)
    assert [c.token_ids for c in mixed] == [c.token_ids for c in alone]
    for i, completion in enumerate(mixed):
        assert (completion.prompt_logprobs is None) == (i % 2 == 0)
        if i % 2:
            assert len(completion.prompt_logprobs) == len(prompts[i])
            assert completion.prompt_logprobs[0] is None
            assert all(lp <= 1e-6 for lp in completion.prompt_logprobs[1:])
