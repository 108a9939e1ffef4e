"""Prompt logprobs equal transformers' log-softmax at the prompt positions: whole prompts, prompts
chunked across steps, repeated prompts with the prefix cache on, top N, under TP=2 (gloo), and
across the wire."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from free_ports import free_port
from inprocess_engine import Engine
from plans import Chunk, make_plan
from tiny_models import build_tiny_checkpoint

from core.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from core.execution import prompt_logprobs
from core.execution.distributed import TPGroup, init_tp_group
from core.execution.runner import ModelRunner
from core.plan import StepResult
from core.sampling_params import SamplingParams, SamplingParamsError
from ipc.step_frames import result_from_frames, result_to_frames
from procs.executor_start import forkserver_context

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-qwen3-prompt-logprobs")
    hf = build_tiny_checkpoint(directory, seed=5)
    return directory, hf


def make_engine(directory, budget=2048, prefix_cache=True, num_pages=256) -> Engine:
    config = EngineConfig(
        model=ModelConfig.from_pretrained(directory, dtype="float32"),
        cache=CacheConfig(block_size=16, num_pages=num_pages, enable_prefix_caching=prefix_cache),
        scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=budget, max_model_len=512),
    )
    return Engine(config, ModelRunner(config, show_progress=False))


def reference(hf, prompt: list[int]) -> torch.Tensor:
    """transformers' log-softmax [len(prompt), vocab] at each prompt position."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)


def assert_matches(hf, prompt: list[int], completion, num_top: int) -> None:
    expected = reference(hf, prompt)
    got = completion.prompt_logprobs
    assert got is not None and len(got) == len(prompt) and got[0] is None
    want = expected[:-1].gather(-1, torch.tensor(prompt[1:])[:, None]).squeeze(-1)
    np.testing.assert_allclose(np.array(got[1:], np.float32), want.numpy(), atol=TOLERANCE)
    ranks = (expected[:-1] > want[:, None]).sum(-1) + 1
    assert completion.prompt_ranks[0] is None
    assert np.abs(np.array(completion.prompt_ranks[1:]) - ranks.numpy()).max() <= 1  # ties at 1e-7
    top = completion.prompt_top_logprobs
    assert top[0] == []
    for position in range(1, len(prompt)):
        assert len(top[position]) == num_top
        if num_top:
            values, ids = expected[position - 1].topk(num_top)
            assert [i for i, _ in top[position]] == ids.tolist()
            np.testing.assert_allclose([v for _, v in top[position]], values.numpy(), atol=TOLERANCE)


def prompts(n: int, seed: int, low: int = 2, high: int = 90) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=int(rng.integers(low, high))).tolist() for _ in range(n)]


@pytest.mark.parametrize("num_top", [0, 3])
def test_whole_prompts_match_transformers(checkpoint, num_top):
    directory, hf = checkpoint
    batch = prompts(6, seed=1)
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=num_top)
    for prompt, completion in zip(batch, make_engine(directory).generate(batch, params)):
        assert_matches(hf, prompt, completion, num_top)


def test_prompts_chunked_across_steps_match_transformers(checkpoint):
    directory, hf = checkpoint
    batch = prompts(5, seed=2, low=40, high=120)
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=2)
    for prompt, completion in zip(batch, make_engine(directory, budget=24).generate(batch, params)):
        assert_matches(hf, prompt, completion, 2)


def test_repeated_prompt_is_scored_again_not_served_from_the_cache(checkpoint):
    directory, hf = checkpoint
    engine = make_engine(directory)
    prompt = prompts(1, seed=3, low=70, high=71)[0]
    engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))  # fills the cache
    again = engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))[0]
    assert again.num_cached_tokens == 0
    assert_matches(hf, prompt, again, 0)
    cached = engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))[0]
    assert cached.num_cached_tokens > 0  # requests without prompt logprobs still hit


def test_mixed_batch_leaves_other_requests_unchanged(checkpoint):
    directory, hf = checkpoint
    batch = prompts(6, seed=4)
    plain = SamplingParams(max_tokens=6, temperature=0.0)
    scored = SamplingParams(max_tokens=6, temperature=0.0, prompt_logprobs=1)
    alone = make_engine(directory, budget=32).generate(batch, plain)
    mixed = make_engine(directory, budget=32).generate(batch, [plain, scored] * 3)
    assert [c.token_ids for c in mixed] == [c.token_ids for c in alone]
    for i, completion in enumerate(mixed):
        if i % 2:
            assert_matches(hf, batch[i], completion, 1)
        else:
            assert completion.prompt_logprobs is None


def test_preempted_request_reports_each_position_once(checkpoint):
    directory, hf = checkpoint
    batch = prompts(4, seed=6, low=60, high=90)
    params = SamplingParams(max_tokens=40, temperature=0.0, prompt_logprobs=0, ignore_eos=True)
    engine = make_engine(directory, budget=48, num_pages=14)
    completions = engine.generate(batch, params)
    assert engine.scheduler.stats().num_preemptions > 0
    for prompt, completion in zip(batch, completions):
        assert_matches(hf, prompt, completion, 0)


def test_prompt_scores_cross_the_wire():
    result = StepResult(step_id=3, replica=0, sampled_token_ids=np.array([5, 0], np.int32),
                        prompt_logprob_start=np.array([0, 3, 3], np.int32),
                        prompt_logprobs=np.array([-1.0, -2.0, -3.0], np.float32),
                        prompt_ranks=np.array([1, 4, 2], np.int32),
                        prompt_top_ids=np.arange(6, dtype=np.int32).reshape(3, 2),
                        prompt_top_logprobs=-np.arange(6, dtype=np.float32).reshape(3, 2))
    done, frames = result_to_frames(result, rank=0)
    back = result_from_frames(done, tuple(memoryview(bytes(f)) for f in frames), num_reqs=2)
    for name in ("prompt_logprob_start", "prompt_logprobs", "prompt_ranks", "prompt_top_ids",
                 "prompt_top_logprobs"):
        np.testing.assert_array_equal(getattr(back, name), getattr(result, name))
    assert back.sampled_logprobs is None


def test_prompt_logprobs_range_is_checked():
    # the upper bound is the server's (--max-logprobs), checked where a request comes in
    with pytest.raises(SamplingParamsError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
    assert SamplingParams(prompt_logprobs=100).prompt_logprobs == 100


def _tp_plan(seed: int = 7):
    """A step of two requests: one scoring a chunk that ends mid-prompt (top 3), one not scoring."""
    rng = np.random.default_rng(seed)
    prompt, other = rng.integers(0, 256, size=30).tolist(), rng.integers(0, 256, size=10).tolist()
    plan = make_plan([Chunk(prompt[:21], 0, [4, 0], sample=False), Chunk(other, 0, [9])], 16)
    return prompt, dataclasses.replace(plan, num_prompt_logprobs=np.array([3, -1], np.int32),
                                       next_prompt_id=np.array([prompt[21], -1], np.int32))


def _tp_config(directory: str, tp_size: int) -> EngineConfig:
    return EngineConfig(model=ModelConfig.from_pretrained(directory, dtype="float32"),
                        parallel=ParallelConfig(tp_size=tp_size),
                        cache=CacheConfig(block_size=16, num_pages=16))


def _tp_worker(rank: int, directory: str, port: int, queue) -> None:
    torch.set_num_threads(1)
    prompt_logprobs.SLICE_ROWS = 8  # several slices, each a collective gather of the LM head
    tp = init_tp_group(rank, 2, f"tcp://127.0.0.1:{port}", backend="gloo")
    try:
        result = ModelRunner(_tp_config(directory, 2), tp=tp, show_progress=False).execute(_tp_plan()[1])
        names = ("prompt_logprob_start", "prompt_logprobs", "prompt_ranks", "prompt_top_ids",
                 "prompt_top_logprobs")
        queue.put(("rank 1", None) if rank else ("rank 0", {name: getattr(result, name) for name in names}))
    finally:
        torch.distributed.destroy_process_group()


def test_tp2_scores_the_prompt_as_tp1_does(checkpoint):
    directory, hf = checkpoint
    prompt, plan = _tp_plan()
    runner = ModelRunner(_tp_config(str(directory), 1), tp=TPGroup(), show_progress=False)
    expected = runner.execute(plan)
    np.testing.assert_array_equal(expected.prompt_logprob_start, [0, 21, 21])
    want = reference(hf, prompt)[:21].gather(-1, torch.tensor(prompt[1:22])[:, None]).squeeze(-1)
    np.testing.assert_allclose(expected.prompt_logprobs, want.numpy(), atol=TOLERANCE)
    assert runner.execute(make_plan([Chunk([1, 2, 3], 0, [0])], 16)).prompt_logprobs is None  # none asked
    port = free_port()
    ctx = forkserver_context()
    queue = ctx.Queue()
    procs = [ctx.Process(target=_tp_worker, args=(r, str(directory), port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0, f"TP worker exited with {p.exitcode}"
    tp2 = results["rank 0"]
    np.testing.assert_array_equal(tp2["prompt_logprob_start"], expected.prompt_logprob_start)
    np.testing.assert_array_equal(tp2["prompt_top_ids"], expected.prompt_top_ids)
    for name in ("prompt_logprobs", "prompt_top_logprobs"):
        np.testing.assert_allclose(tp2[name], getattr(expected, name), atol=1e-5)
    assert np.abs(tp2["prompt_ranks"] - expected.prompt_ranks).max() <= 1


def test_the_profiled_warmup_step_scores_every_row_in_slices(checkpoint, monkeypatch):
    from core.execution.warmup_steps import warmup_plan

    directory, _ = checkpoint
    monkeypatch.setattr(prompt_logprobs, "SLICE_ROWS", 16)
    runner = ModelRunner(_tp_config(str(directory), 1), tp=TPGroup(), show_progress=False)
    plan = dataclasses.replace(warmup_plan([(0, 100)], 16, 256), num_prompt_logprobs=np.array([20], np.int32))
    _, _, scores = runner.forward(plan)
    assert scores.logprobs.shape == (99,) and scores.top_ids.shape == (99, 20)
    assert (scores.ranks >= 1).all() and (scores.top_logprobs[:, 0] >= scores.logprobs).all()
