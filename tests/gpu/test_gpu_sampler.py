"""The sampler on the GPU: its Triton kernels against its torch paths at Qwen3's vocabulary, seeded
draws independent of the batch (bf16 logits with many ties included), the draws' distribution, and
the decode graph's sampling against the eager sampler on the same logits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from test_sampler import make_plan
from test_sampler_statistics import assert_draws_follow, filtered_distribution, mixed_batch

from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.runner import ModelRunner
from core.execution.sampler import Sampler, SamplingTensors, sample_tokens

VOCAB = 151_936


def tensors(settings: dict, num_rows: int, device: str = "cuda") -> SamplingTensors:
    plan = make_plan(num_rows, **settings)
    return SamplingTensors.from_plan(plan, plan.sampled_rows, device)


def row(settings: dict, i: int) -> dict:
    return {name: np.asarray(value)[i : i + 1] for name, value in settings.items()}


@pytest.mark.parametrize("ties", [False, True])
def test_kernels_draw_the_tokens_of_the_torch_paths(ties):
    logits, settings = mixed_batch(256, VOCAB, seed=81, ties=ties)
    logits = logits.cuda()
    st = tensors(settings, 256)
    kernels = sample_tokens(logits, st, use_triton=True)
    assert torch.equal(kernels, sample_tokens(logits, st, use_triton=False))
    on_cpu = sample_tokens(logits.cpu(), tensors(settings, 256, "cpu"), use_triton=False)
    assert int((kernels.cpu() != on_cpu).sum()) <= 1  # the CPU's and the GPU's exp may differ in a last bit


@pytest.mark.parametrize("ties", [False, True])
def test_seeded_draws_do_not_depend_on_the_batch_on_the_gpu(ties):
    logits, settings = mixed_batch(256, VOCAB, seed=91, ties=ties)
    logits = logits.cuda()
    together = sample_tokens(logits, tensors(settings, 256))
    for i in range(0, 256, 17):
        assert sample_tokens(logits[i : i + 1], tensors(row(settings, i), 1))[0] == together[i], f"row {i}"


def test_draws_at_qwen3_defaults_follow_the_filtered_distribution():
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(5)) * 2.0
    logits[:40] += torch.linspace(6.0, 3.0, 40)
    num_draws = 40_000
    out = sample_tokens(logits.cuda().expand(num_draws, -1).contiguous(), tensors(
        dict(temperature=0.6, top_p=0.95, top_k=20, seed=np.arange(num_draws) * 31 + 7), num_draws))
    assert_draws_follow(out.cpu(), filtered_distribution(logits.numpy(), 0.6, 20, 0.95))


def test_top_p_alone_over_the_whole_vocabulary_follows_the_nucleus():
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(6)) * 1.0
    logits[:200] += 5.0
    num_draws = 20_000
    out = sample_tokens(logits.cuda().expand(num_draws, -1).contiguous(), tensors(
        dict(temperature=1.0, top_p=0.9, min_p=0.01, seed=np.arange(num_draws)), num_draws))
    assert_draws_follow(out.cpu(), filtered_distribution(logits.numpy(), 1.0, 0, 0.9, 0.01))


@torch.inference_mode()
def test_graph_sampling_equals_the_eager_sampler_on_the_same_logits():
    config = EngineConfig(model=ModelConfig.from_name("qwen3-tiny", dtype="bfloat16"),
                          cache=CacheConfig(block_size=16, num_pages=512),
                          scheduler=SchedulerConfig(max_model_len=256, max_num_seqs=64), device="cuda")
    runner = ModelRunner(config, show_progress=False)
    assert runner.graphs is not None
    rng = np.random.default_rng(3)
    for batch in (1, 5, 33, 64):
        _, settings = mixed_batch(batch, 16, seed=batch)
        settings["top_k"] = np.minimum(settings["top_k"], 50)  # within the graph's candidates
        plan = make_plan(batch, **settings)
        plan.input_ids[:] = rng.integers(0, 150_000, batch)
        logits = runner.graphs.run(plan)
        st = SamplingTensors.from_plan(plan, plan.sampled_rows, "cuda")
        if st.all_greedy:
            continue
        assert runner.graphs.can_sample(st)
        eager = sample_tokens(logits.clone(), st)
        assert torch.equal(runner.graphs.sample(st), eager), f"batch {batch}"
    penalized = make_plan(2, temperature=1.0, repetition_penalty=1.2, history=[([1], [2]), ([3], [4])])
    runner.graphs.run(penalized)
    assert not runner.graphs.can_sample(SamplingTensors.from_plan(penalized, penalized.sampled_rows, "cuda"))
    biased = replace(make_plan(2, temperature=1.0), bias_start=np.array([0, 1, 1], np.int32),
                     bias_ids=np.array([7], np.int32), bias_values=np.array([100.0], np.float32))
    logits = runner.graphs.run(biased)
    st = SamplingTensors.from_plan(biased, biased.sampled_rows, "cuda")
    assert not runner.graphs.can_sample(st)  # the eager sampler adds the bias
    assert Sampler()(logits, st).token_ids[0].item() == 7
