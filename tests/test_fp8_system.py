"""A fine-grained FP8 checkpoint served end to end on the CPU: tokenizer, scheduler and executor
processes for real. Its greedy tokens equal those of its dequantized float32 twin served the same
way (the CPU multiplies the dequantized weights, so the two differ in no float operation), at TP=1
and TP=2 over gloo; `--quantization fp8` on the bf16 checkpoint serves the same tokens as the
checkpoint quantized offline."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from system_client import GREEDY, SystemClient
from tiny_models import build_tiny_fp8_checkpoints

from core.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from procs.launcher import Launcher, LaunchOptions

# Lengths around the page size (16) and past the step budget (128), so chunked prefill runs too.
PROMPT_LENGTHS = (1, 15, 17, 40, 200)


def engine_config(model: ModelConfig, tp: int = 1) -> EngineConfig:
    return EngineConfig(model=model, parallel=ParallelConfig(tp_size=tp), cache=CacheConfig(num_pages=256),
                        scheduler=SchedulerConfig(max_model_len=512, max_num_seqs=16,
                                                  max_num_batched_tokens=128), device="cpu")


def greedy_tokens(config: EngineConfig) -> dict[str, list[int]]:
    rng = np.random.default_rng(0)
    # The checkpoint's vocabulary is 512 ids; the built-in Qwen tokenizer detokenizes them.
    prompts = {f"ids-{n}": {"prompt_token_ids": rng.integers(0, 512, n).tolist()} for n in PROMPT_LENGTHS}
    with Launcher(config, LaunchOptions(startup_timeout_s=180)) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        results = client.generate(prompts, GREEDY)
    for key, result in results.items():
        assert result.error is None, f"{key}: {result.error}"
        assert len(result.token_ids) == GREEDY.max_tokens
    return {key: result.token_ids for key, result in results.items()}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return build_tiny_fp8_checkpoints(tmp_path_factory.mktemp("fp8-system"), seed=7)


@pytest.fixture(scope="module")
def dequantized_tokens(checkpoints):
    return greedy_tokens(engine_config(ModelConfig.from_pretrained(checkpoints["dequantized"],
                                                                   dtype="float32")))


def test_fp8_checkpoint_serves_the_greedy_tokens_of_its_dequantized_twin(checkpoints, dequantized_tokens):
    fp8 = ModelConfig.from_pretrained(checkpoints["fp8"], dtype="float32")
    assert fp8.quantization == "fp8"
    assert greedy_tokens(engine_config(fp8)) == dequantized_tokens


def test_fp8_checkpoint_at_tp2_serves_the_same_greedy_tokens(checkpoints, dequantized_tokens):
    fp8 = ModelConfig.from_pretrained(checkpoints["fp8"], dtype="float32")
    assert greedy_tokens(engine_config(fp8, tp=2)) == dequantized_tokens


def test_quantization_fp8_at_load_serves_the_offline_quantized_tokens(checkpoints, dequantized_tokens):
    bf16 = ModelConfig.from_pretrained(checkpoints["bf16"], dtype="float32")
    config = engine_config(bf16.quantized_at_load("fp8"))
    config = dataclasses.replace(config, scheduler=dataclasses.replace(config.scheduler,
                                                                       async_scheduling=False))
    tokens = greedy_tokens(config)
    assert tokens == dequantized_tokens
    assert len({tuple(t) for t in tokens.values()}) > 1, "distinct prompts, distinct continuations"
