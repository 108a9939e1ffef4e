"""api/offline.py: `LLM` starts the engine's processes for one program and generates through them;
its greedy tokens are the in-process engine's, a bad flag is a ValueError, and a refused prompt
comes back refused while the others run."""

from __future__ import annotations

import pytest
from inprocess_engine import Engine
from tiny_models import build_tiny_checkpoint

from api.offline import LLM
from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.runner import ModelRunner
from core.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPTS = [[5, 17, 42, 99], [7, 7, 7], list(range(10, 60))]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-qwen3-offline")
    build_tiny_checkpoint(directory, seed=5)
    return directory


def test_offline_greedy_tokens_are_the_in_process_engines(checkpoint):
    config = EngineConfig(model=ModelConfig.from_pretrained(checkpoint, dtype="float32"),
                          cache=CacheConfig(num_pages=128),
                          scheduler=SchedulerConfig(max_model_len=256))
    expected = [r.token_ids for r in Engine(config, ModelRunner(config, show_progress=False))
                .generate(PROMPTS, GREEDY)]
    flags = ("--device", "cpu", "--dtype", "float32", "--max-model-len", "256",
             "--num-gpu-blocks-override", "128", "--dp", "2")
    with LLM(str(checkpoint), *flags, timeout_s=120) as llm:
        results = llm.generate([*PROMPTS, list(range(300))], GREEDY, detokenize=False)
    assert [r.token_ids for r in results[:3]] == expected
    assert all(r.ok and r.finish_reason == "length" for r in results[:3])
    refused = results[3]
    assert refused.refused is not None and "256" in refused.refused.message


def test_offline_bad_flag_is_a_value_error_not_an_exit():
    with pytest.raises(ValueError, match="--no-such-flag"):
        LLM("qwen3-tiny", "--no-such-flag")
