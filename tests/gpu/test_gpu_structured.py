"""Structured outputs on the GPU: the masks unpacked on the device, steps whose forward replays a
decode graph and whose sampling then runs eagerly, async scheduling's placeholders (the executor
adds the token in flight to a request's output): every output is what its spec asks for, and the
greedy ones are the tokens of one step at a time without graphs.

qwen3-tiny in float32 with CUDA graphs; ignore_eos is off (a grammar ends a request by its EOS)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
from system_client import SystemClient, tiny_config

from benchmarks.generalization.workload import STRUCTURED_SCHEMA, STRUCTURED_TOOL
from benchmarks.lib.schema_check import conforms
from core.config import ModelConfig
from core.sampling_params import SamplingParams
from core.structured.specs import json_schema_spec, tool_calls_spec
from procs.launcher import Launcher, LaunchOptions

SPECS = {"schema": json_schema_spec(STRUCTURED_SCHEMA), "tools": tool_calls_spec([STRUCTURED_TOOL])}


def _outputs(async_scheduling: bool, enforce_eager: bool) -> dict[str, tuple[str, list[int]]]:
    config = tiny_config(max_num_batched_tokens=512)
    config = dataclasses.replace(
        config, device="cuda", model=ModelConfig.from_name("qwen3-tiny", dtype="float32"),
        enforce_eager=enforce_eager,
        scheduler=dataclasses.replace(config.scheduler, async_scheduling=async_scheduling))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 151_000, n).tolist() for n in (1, 9, 33, 120)]
    results = {}
    with Launcher(config, LaunchOptions(startup_timeout_s=300)) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        for name, spec in SPECS.items():
            for sampling in ({"temperature": 0.0}, {"temperature": 1.0, "seed": 3}):
                params = SamplingParams(max_tokens=300, structured_output=spec, **sampling)
                batch = {f"{name}-{sampling['temperature']}-{i}": {"prompt_token_ids": ids}
                         for i, ids in enumerate(prompts)}
                for key, result in client.generate(batch, params).items():
                    assert result.error is None and result.finish_reason == "stop", result
                    results[key] = (result.text, result.token_ids)
    return results


def _check(outputs: dict[str, tuple[str, list[int]]]) -> None:
    for key, (text, _) in outputs.items():
        if key.startswith("schema"):
            assert conforms(json.loads(text), STRUCTURED_SCHEMA), (key, text)
        else:
            call = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
            assert call["name"] == "lookup" and conforms(call["arguments"], STRUCTURED_TOOL["parameters"])


def test_structured_outputs_with_graphs_and_async_scheduling_conform_and_reproduce():
    graphed = _outputs(async_scheduling=True, enforce_eager=False)
    _check(graphed)
    eager = _outputs(async_scheduling=False, enforce_eager=True)
    _check(eager)
    for key, (_, tokens) in graphed.items():
        assert tokens == eager[key][1], key  # float32: the same kernels' numbers either way
