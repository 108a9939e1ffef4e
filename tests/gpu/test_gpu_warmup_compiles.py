"""After a CUDA runner's start, serving compiles no extend-attention variant: the warm-up steps
(core/execution/warmup_steps.py) reached every tile family over fresh prompts and over cached prefixes."""

from __future__ import annotations

import pytest
import torch

from core.config import EngineConfig, ModelConfig, SchedulerConfig
from core.execution.attention.triton_extend import _extend_kernel
from core.execution.runner import ModelRunner
from core.execution.warmup_steps import warmup_plan

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def compiled_variants(kernel) -> int:
    caches = getattr(kernel, "device_caches", None)
    if caches is None:
        pytest.skip("this triton keeps its compiled kernels elsewhere")
    return sum(len(entry[0]) for entry in caches.values())


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    """One runner for the module: its start-up warm-up is what the tests check."""
    config = EngineConfig(model=ModelConfig.from_name("qwen3-tiny", dtype="bfloat16"),
                          scheduler=SchedulerConfig(max_model_len=2048, max_num_seqs=8), device="cuda")
    return ModelRunner(config, show_progress=False)


@pytest.mark.parametrize("requests", [
    [(0, 5)], [(0, 3), (9, 1)], [(16, 3)],  # chunks of at most 64 queries, fresh and after a prefix
    [(0, 100)], [(32, 100), (7, 1)],  # at most 512 keys
    [(0, 700)], [(50, 700)], [(0, 300), (0, 300)],  # more
    [(0, 3), (20, 30), (100, 1)],  # fresh beside cached: the pages
], ids=str)
def test_no_extend_variant_compiles_after_the_warm_up(runner, requests):
    config = runner.config
    before = compiled_variants(_extend_kernel)
    plan = warmup_plan(requests, config.cache.block_size, config.model.vocab_size)
    logits, _ = runner.forward_logits(plan, runner.kv_cache)  # eager, as a step outside the graphs runs
    torch.cuda.synchronize()
    assert logits is not None and torch.isfinite(logits).all()
    assert compiled_variants(_extend_kernel) == before, f"{requests} compiled a new extend variant"
