"""TP=2 on the one GPU, end to end: two ranks sharing cuda:0 join over gloo, take their small
all-reduces through the one-shot kernel (core/execution/custom_all_reduce.py), and so replay decode
CUDA graphs; their greedy tokens equal those of the same layout run eagerly (--enforce-eager), and
of the same layout with the kernel off (every all-reduce through gloo, no graphs). The sampled
defaults draw the same seeded tokens in graphs and eagerly.

    python -m pytest tests/gpu/test_gpu_tp_one_card.py -s
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from system_client import GREEDY, SystemClient, tiny_config

from core.sampling_params import SamplingParams
from procs.launcher import Launcher, LaunchOptions

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = {f"p{i}": {"prompt": f"request {i}: " + "count the stars " * (i + 1)} for i in range(12)}
SAMPLED = SamplingParams(max_tokens=12, temperature=0.6, top_p=0.95, top_k=20, seed=7, ignore_eos=True)


def _serve(**changes) -> dict[str, dict[str, list[int]]]:
    parallel = changes.pop("parallel", {})
    config = tiny_config(tp=2, num_pages=256)
    config = dataclasses.replace(config, device="cuda:0",
                                 parallel=dataclasses.replace(config.parallel, **parallel), **changes)
    with Launcher(config, LaunchOptions(startup_timeout_s=300)) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        tokens = {}
        for name, params in (("greedy", GREEDY), ("sampled", SAMPLED)):
            results = client.generate(PROMPTS, params)
            assert all(r.error is None for r in results.values()), [r.error for r in results.values()]
            tokens[name] = {k: r.token_ids for k, r in results.items()}
        return tokens


def test_tp2_on_one_card_replays_graphs_with_the_eager_tokens():
    graphs = _serve()
    eager = _serve(enforce_eager=True)
    assert graphs["greedy"] == eager["greedy"]
    assert graphs["sampled"] == eager["sampled"]
    no_kernel = _serve(parallel={"disable_custom_all_reduce": True})
    assert no_kernel["greedy"] == eager["greedy"]


def _serve_one_at_a_time(tp: int, **changes) -> dict[str, list[int]]:
    """Each prompt alone, in float32: its prefill is a small step (12-40 tokens)."""
    config = tiny_config(tp=tp, num_pages=256)
    config = dataclasses.replace(config, device="cuda:0", model=config.model.with_overrides(dtype="float32"),
                                 **changes)
    with Launcher(config, LaunchOptions(startup_timeout_s=300)) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        tokens = {}
        for key, prompt in PROMPTS.items():
            result = client.generate({key: prompt}, GREEDY)[key]
            assert result.error is None, result.error
            tokens[key] = result.token_ids
        return tokens


@pytest.mark.parametrize("tp", [1, 2])
def test_small_steps_through_the_decode_graphs_keep_the_eager_tokens(tp):
    """--small-step-graphs: each prompt's prefill replays the decode graph one row per token
    (core/execution/token_rows.py), on one rank and on two sharing the card."""
    assert _serve_one_at_a_time(tp, small_step_graphs=True) == _serve_one_at_a_time(tp, enforce_eager=True)
