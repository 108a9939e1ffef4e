"""Cadence's Qwen3 computes what transformers' Qwen3ForCausalLM computes, from the same checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from plans import Chunk, make_plan
from tiny_models import build_tiny_checkpoint

from core.config import CacheConfig, EngineConfig, ModelConfig
from core.execution.runner import ModelRunner

BLOCK_SIZE = 16


def cadence_runner(directory, block_size=BLOCK_SIZE, num_pages=64) -> ModelRunner:
    config = EngineConfig(model=ModelConfig.from_pretrained(directory, dtype="float32"),
                          cache=CacheConfig(block_size=block_size, num_pages=num_pages))
    return ModelRunner(config, show_progress=False)


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_prefill_and_every_decode_step_match_transformers(tmp_path, tie):
    hf = build_tiny_checkpoint(tmp_path, tie=tie, seed=1)
    runner = cadence_runner(tmp_path)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 256, size=37).tolist()
    num_decode = 220
    # Pages out of order, so the block table really indirects.
    pages = rng.permutation(64)[: -(-(len(prompt) + num_decode) // BLOCK_SIZE)].tolist()

    with torch.no_grad():
        hf_out = hf(torch.tensor([prompt]), use_cache=True)
        hf_logits, past = hf_out.logits[0, -1], hf_out.past_key_values
        ours, _ = runner.forward_logits(make_plan([Chunk(prompt, 0, pages)], BLOCK_SIZE))
        assert relative_error(ours[0], hf_logits) < 1e-4
        position = len(prompt)
        for step in range(num_decode):
            token = int(hf_logits.argmax())
            assert int(ours[0].argmax()) == token, f"greedy token differs at decode step {step}"
            hf_out = hf(torch.tensor([[token]]), past_key_values=past, use_cache=True)
            hf_logits, past = hf_out.logits[0, -1], hf_out.past_key_values
            plan = make_plan([Chunk([token], position, pages)], BLOCK_SIZE, step_id=step + 1)
            ours, _ = runner.forward_logits(plan)
            error = relative_error(ours[0], hf_logits)
            assert error < 1e-4, f"decode step {step}: relative logits error {error:.2e}"
            position += 1


def test_chunked_prefill_and_batched_requests_match_transformers(tmp_path):
    """Two requests in one step, one of them a second prefill chunk that starts mid-page."""
    hf = build_tiny_checkpoint(tmp_path, seed=2)
    runner = cadence_runner(tmp_path)
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, size=29).tolist()
    b = rng.integers(0, 256, size=11).tolist()
    runner.forward_logits(make_plan([Chunk(a[:13], 0, [5, 9], sample=False)], BLOCK_SIZE))
    ours, rows = runner.forward_logits(make_plan([Chunk(a[13:], 13, [5, 9]), Chunk(b, 0, [3])], BLOCK_SIZE))
    assert rows.tolist() == [0, 1]
    with torch.no_grad():
        for i, prompt in enumerate((a, b)):
            theirs = hf(torch.tensor([prompt])).logits[0, -1]
            assert relative_error(ours[i], theirs) < 1e-4


def test_greedy_runner_tokens_equal_transformers_generate(tmp_path):
    hf = build_tiny_checkpoint(tmp_path, seed=3)
    runner = cadence_runner(tmp_path)
    prompt = list(range(40, 60))
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False)[0, len(prompt):]
    pages = [7, 1, 4, 2]
    result = runner.execute(make_plan([Chunk(prompt, 0, pages)], BLOCK_SIZE))
    tokens = [int(result.sampled_token_ids[0])]
    for i in range(29):
        result = runner.execute(make_plan([Chunk([tokens[-1]], len(prompt) + i, pages, output_pos=i + 1)],
                                          BLOCK_SIZE))
        tokens.append(int(result.sampled_token_ids[0]))
    assert tokens == expected.tolist()
