"""A small step that is not a pure decode, run as one decode row per token (core/execution/token_rows.py):
the rows compute the step's logits, and the runner sends such steps to the decode graphs only where
--small-step-graphs allows and the step fits.

On the CPU (float32, the reference attention backend) the rows' logits equal the step's own within
float32 noise; the graphs themselves replay on a GPU (tests/gpu/test_gpu_decode_graphs.py), so here a
stand-in runs eagerly whatever a graph would replay, and records the plans it got.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from plans import Chunk, make_plan

from core.config import CacheConfig, EngineConfig, ModelConfig
from core.execution import runner as runner_module
from core.execution.attention.backend import AttentionMetadata
from core.execution.decode_graphs import DecodeGraphs
from core.execution.runner import ModelRunner
from core.execution.token_rows import as_token_rows, extra_kv_reads

BLOCK_SIZE = 16
PROMPT = np.random.default_rng(3).integers(0, 500, size=40).tolist()


def make_runner(**engine) -> ModelRunner:
    model = ModelConfig.from_name("qwen3-tiny", dtype="float32")
    return ModelRunner(EngineConfig(model=model, cache=CacheConfig(block_size=BLOCK_SIZE, num_pages=32),
                                    **engine), show_progress=False)


class EagerGraphs:
    """DecodeGraphs' part the runner calls, run eagerly on the CPU: what a graph replays."""

    def __init__(self, runner: ModelRunner, max_batch: int) -> None:
        self.runner, self.max_batch, self.plans = runner, max_batch, []

    def can_run(self, plan) -> bool:
        return DecodeGraphs.can_run(self, plan)  # type: ignore[arg-type]

    def can_sample(self, st) -> bool:
        return False

    def run(self, plan, fill=None) -> torch.Tensor:
        self.plans.append(plan)
        input_ids = torch.as_tensor(plan.input_ids).long()
        if fill is not None:
            fill(input_ids)
        meta = AttentionMetadata.from_plan(plan, self.runner.device)
        hidden = self.runner.model(input_ids, torch.as_tensor(plan.positions).long(), self.runner.kv_cache,
                                   self.runner.backend, meta)
        return self.runner.model.compute_logits(hidden)


def mixed_step(step_id: int = 1):
    """After PROMPT's first 32 tokens are cached on pages 0-1 and a request decodes on pages 4-5: that
    decode, PROMPT's last 8 tokens after the cached 32, a 5-token prompt of its own (page 7), and 3
    tokens of a prompt that continues next step (mid-prefill: no sample)."""
    return make_plan([Chunk([17], 20, [4, 5]), Chunk(PROMPT[32:], 32, [0, 1, 2]),
                      Chunk([1, 2, 3, 4, 5], 0, [7]), Chunk([9, 8, 7], 0, [9], sample=False)],
                     BLOCK_SIZE, step_id=step_id)


def warm_caches(runner: ModelRunner) -> None:
    """What mixed_step's context needs in the cache: PROMPT's first 32 tokens, and 20 tokens on 4-5."""
    runner.forward_logits(make_plan([Chunk(PROMPT[:32], 0, [0, 1, 2]),
                                     Chunk(list(range(100, 120)), 0, [4, 5])], BLOCK_SIZE))


def test_a_step_becomes_a_row_per_token_over_its_requests_pages():
    plan = mixed_step()
    rows = as_token_rows(plan)
    assert rows.num_reqs == rows.num_tokens == plan.num_tokens == 17
    assert rows.query_start.tolist() == list(range(18))
    assert rows.seq_lens.tolist() == (plan.positions + 1).tolist()
    assert rows.seq_lens[:9].tolist() == [21, *range(33, 41)]  # the decode; the chunk after 32 cached
    request = [0] + [1] * 8 + [2] * 5 + [3] * 3
    assert np.array_equal(rows.block_table, plan.block_table[request])
    assert np.array_equal(rows.kv_index, plan.kv_index) and np.array_equal(rows.input_ids, plan.input_ids)
    assert rows.logits_index.tolist() == list(range(17))


def test_extra_kv_reads_count_what_the_rows_read_beyond_each_context_once():
    plan = mixed_step()
    # decode 0; 8 after 32 cached: 7 * 32 + 8 * 7 / 2; 5 fresh: 10; 3 fresh: 3
    assert extra_kv_reads(plan) == 0 + (7 * 32 + 28) + 10 + 3
    decode = make_plan([Chunk([5], 40, [0, 1, 2]), Chunk([6], 3, [3])], BLOCK_SIZE)
    assert extra_kv_reads(decode) == 0


def test_the_rows_compute_the_steps_logits():
    steps, rows = make_runner(), make_runner()
    for runner in (steps, rows):
        warm_caches(runner)
    plan = mixed_step()
    expected, sampled = steps.forward_logits(plan)
    assert sampled.tolist() == [0, 1, 2]
    every_row, _ = rows.forward_logits(as_token_rows(plan))
    got = every_row[plan.logits_index[sampled]]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # and the rows wrote the same K/V: a decode after it reads the same context
    after = make_plan([Chunk([3], 40, [0, 1, 2])], BLOCK_SIZE, step_id=2)
    torch.testing.assert_close(rows.forward_logits(after)[0], steps.forward_logits(after)[0],
                               rtol=1e-5, atol=1e-5)


def graphed_runner(max_batch: int = 64, **engine) -> tuple[ModelRunner, EagerGraphs]:
    runner = make_runner(small_step_graphs=True, **engine)
    runner.graphs = EagerGraphs(runner, max_batch)
    warm_caches(runner)
    runner.graphs.plans.clear()
    return runner, runner.graphs


def test_with_small_step_graphs_the_runner_replays_the_rows_and_takes_the_sampling_ones():
    runner, graphs = graphed_runner()
    eager = make_runner()
    warm_caches(eager)
    plan = mixed_step()
    logits, sampled = runner.forward_logits(plan)
    assert len(graphs.plans) == 1 and graphs.plans[0].num_reqs == plan.num_tokens  # one row a token
    expected, expected_rows = eager.forward_logits(plan)
    assert np.array_equal(sampled, expected_rows)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    tokens = runner.execute(dataclasses.replace(plan, step_id=2)).sampled_token_ids
    assert tokens[3] == 0 and len(tokens) == 4  # mid-prefill samples nothing


def test_seeded_sampling_draws_the_eager_steps_tokens_through_the_rows():
    runner, _ = graphed_runner()
    eager = make_runner()
    warm_caches(eager)
    chunks = [Chunk([17], 20, [4, 5], temperature=0.6, seed=7),
              Chunk(PROMPT[32:], 32, [0, 1, 2], temperature=0.6, seed=8, output_pos=3)]
    plan = make_plan(chunks, BLOCK_SIZE, step_id=1)
    assert runner.graphs is not None and not runner.graphs.can_run(plan)
    tokens = runner.execute(plan).sampled_token_ids
    assert runner.graphs.plans and tokens.tolist() == eager.execute(plan).sampled_token_ids.tolist()


def test_placeholder_inputs_are_filled_into_their_token_rows():
    """Async scheduling: a decode's input is the token the previous step sampled at row prev_row."""
    runner, graphs = graphed_runner()
    first = make_plan([Chunk([11], 20, [4, 5]), Chunk([12, 13], 0, [7])], BLOCK_SIZE, step_id=1)
    drawn = runner.execute(first).sampled_token_ids
    second = make_plan([Chunk([0], 21, [4, 5]), Chunk(PROMPT[32:], 32, [0, 1, 2])], BLOCK_SIZE, step_id=2)
    second = dataclasses.replace(second, prev_row=np.array([0, -1], np.int32))
    runner.forward_logits(second)
    assert graphs.plans[-1].num_reqs == second.num_tokens
    assert graphs.plans[-1].input_ids[0] == 0  # the plan's placeholder...
    eager = make_runner()
    warm_caches(eager)
    eager.execute(first)
    known = dataclasses.replace(second, input_ids=np.concatenate([[drawn[0]], second.input_ids[1:]])
                                .astype(np.int32), prev_row=np.array([-1, -1], np.int32))
    # ...and the graph's input: the logits are those of the drawn token's step
    torch.testing.assert_close(runner.forward_logits(second)[0], eager.forward_logits(known)[0],
                               rtol=1e-5, atol=1e-5)


def test_steps_stay_eager_without_the_flag_past_the_ladder_or_the_bound_or_scoring_prompts(monkeypatch):
    plan = mixed_step()
    off = make_runner(small_step_graphs=False)
    off.graphs = EagerGraphs(off, 64)
    warm_caches(off)
    off.graphs.plans.clear()
    off.forward_logits(plan)
    assert off.graphs.plans == []  # --small-step-graphs off
    narrow, graphs = graphed_runner(max_batch=16)
    narrow.forward_logits(plan)
    assert graphs.plans == []  # 17 tokens, a ladder up to 16
    runner, graphs = graphed_runner()
    monkeypatch.setattr(runner_module, "TOKEN_ROWS_MAX_EXTRA_KV_READS", extra_kv_reads(plan) - 1)
    runner.forward_logits(plan)
    assert graphs.plans == []
    monkeypatch.setattr(runner_module, "TOKEN_ROWS_MAX_EXTRA_KV_READS", extra_kv_reads(plan))
    runner.forward_logits(plan)
    assert len(graphs.plans) == 1
    scoring = dataclasses.replace(plan, num_prompt_logprobs=np.array([-1, 2, -1, -1], np.int32))
    runner.forward(scoring)
    assert len(graphs.plans) == 1  # prompt scores come from the eager path


@pytest.mark.parametrize("flag,expected", [([], True), (["--small-step-graphs"], True),
                                           (["--no-small-step-graphs"], False)])
def test_the_flag_reaches_the_engine_config(flag, expected):
    from api import cli
    from procs.args import config_from_args

    assert config_from_args(cli.build_parser().parse_args(["serve", *flag])).small_step_graphs is expected


def test_a_server_with_the_flag_serves_on_the_cpu_as_without_it():
    """The flag travels to the executors; without a GPU there are no graphs, so nothing changes."""
    from system_client import GREEDY, SystemClient, tiny_config

    from procs.launcher import Launcher, LaunchOptions

    prompts = {f"p{i}": {"prompt": "count the stars " * (i + 1)} for i in range(3)}
    tokens = []
    for flag in (False, True):
        config = dataclasses.replace(tiny_config(num_pages=128), small_step_graphs=flag)
        with Launcher(config, LaunchOptions(startup_timeout_s=120)) as launcher, \
                SystemClient(launcher.endpoints.tokenizer_frontend) as client:
            results = client.generate(prompts, GREEDY)
        assert all(r.error is None and r.failed is None for r in results.values())
        tokens.append({key: r.token_ids for key, r in results.items()})
    assert tokens[0] == tokens[1]
