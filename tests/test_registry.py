"""The registries of core/registry.py: every registered name builds a class of its interface, the
config and the command line accept exactly the registered names, and a model, an attention backend or
a linear method registered by one line is what the runner serves, with no change to the model or the
runner."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from plans import Chunk, make_plan
from safetensors.torch import load_file
from tiny_models import build_tiny_checkpoint
from torch import nn

from core.config import CacheConfig, ConfigError, EngineConfig, ModelConfig
from core.execution.attention import make_backend
from core.execution.attention.backend import AttentionBackend
from core.execution.attention.reference import ReferenceAttention
from core.execution.model.causal_lm import CausalLM
from core.execution.model.linear_method import LinearMethod
from core.execution.model.qwen3 import Qwen3ForCausalLM
from core.execution.model.unquantized_linear import UnquantizedLinearMethod
from core.execution.registry import registered_class
from core.execution.runner import ModelRunner
from core.registry import ATTENTION_BACKENDS, AUTO_ATTENTION_BACKENDS, LINEAR_METHODS, MODEL_TYPES
from procs.args import add_engine_args


class DoubledLogitsQwen3(Qwen3ForCausalLM):
    """Qwen3 whose logits are doubled: a model class the runner can only get from the registry."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return 2 * super().compute_logits(hidden)


class CountingReferenceAttention(ReferenceAttention):
    name = "counting-reference"

    def __init__(self, device=None) -> None:
        super().__init__(device)
        self.num_calls = 0

    def forward(self, *args) -> torch.Tensor:
        self.num_calls += 1
        return super().forward(*args)


class Float64LinearMethod(UnquantizedLinearMethod):
    """Keeps every linear weight in float64 whatever the model's dtype, as a quantized format keeps its
    own: the loader must cast each checkpoint tensor to its parameter's dtype."""

    def create_weights(self, layer: nn.Module, in_features: int, out_sizes: list[int]) -> None:
        layer.weight = nn.Parameter(torch.empty(sum(out_sizes), in_features, dtype=torch.float64))

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.double(), layer.weight).to(x.dtype)


def serve(directory, attention_backend: str = "auto") -> ModelRunner:
    config = EngineConfig(model=ModelConfig.from_pretrained(directory, dtype="float32"),
                          cache=CacheConfig(block_size=16, num_pages=8), attention_backend=attention_backend)
    return ModelRunner(config, show_progress=False)


def prompt_logits(runner: ModelRunner) -> torch.Tensor:
    prompt = np.random.default_rng(0).integers(0, 256, size=20).tolist()
    return runner.forward_logits(make_plan([Chunk(prompt, 0, [5, 2])], 16))[0]


def edit_config_json(directory, edit) -> None:
    path = directory / "config.json"
    hf = json.loads(path.read_text())
    edit(hf)
    path.write_text(json.dumps(hf))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny")
    build_tiny_checkpoint(directory, seed=6)
    return directory


# --- the tables ----------------------------------------------------------------------------------


def test_every_registered_name_loads_a_class_of_its_interface():
    for model_type in MODEL_TYPES:
        assert issubclass(registered_class(MODEL_TYPES, model_type, "model type"), CausalLM)
    for name in ATTENTION_BACKENDS:
        backend_class = registered_class(ATTENTION_BACKENDS, name, "attention backend")
        assert issubclass(backend_class, AttentionBackend) and backend_class.name == name
    for quantization in LINEAR_METHODS:
        assert issubclass(registered_class(LINEAR_METHODS, quantization, "quantization"), LinearMethod)
    assert set(AUTO_ATTENTION_BACKENDS.values()) <= set(ATTENTION_BACKENDS)
    assert set(AUTO_ATTENTION_BACKENDS) == {"cpu", "cuda"}, "every device a config accepts"


def test_unknown_names_are_refused_naming_the_registered_ones():
    with pytest.raises(ValueError, match="unknown attention backend 'flash': use one of reference, triton"):
        make_backend("flash", "cpu")
    with pytest.raises(ValueError, match="unknown model type 'llama': use one of qwen3"):
        registered_class(MODEL_TYPES, "llama", "model type")
    with pytest.raises(ConfigError, match="unknown attention backend 'flash': use one of auto, reference, "
                                          "triton"):
        EngineConfig(model=ModelConfig.from_name("qwen3-tiny"), attention_backend="flash")


def test_the_command_line_offers_exactly_auto_and_the_registered_backends():
    parser = add_engine_args(argparse.ArgumentParser())
    for name in ("auto", *ATTENTION_BACKENDS):
        assert parser.parse_args(["--attention-backend", name]).attention_backend == name
    with pytest.raises(SystemExit):
        parser.parse_args(["--attention-backend", "flash"])


def test_only_backends_that_support_decode_graphs_say_so():
    assert make_backend("triton", "cpu").supports_decode_graphs
    reference = make_backend("reference", "cpu")
    assert not reference.supports_decode_graphs and reference.launch_state() is None


# --- one registration line -----------------------------------------------------------------------


def test_a_model_type_registered_by_one_line_is_the_class_the_runner_builds(checkpoint, tmp_path,
                                                                            monkeypatch):
    expected = prompt_logits(serve(checkpoint))
    monkeypatch.setitem(MODEL_TYPES, "qwen3-doubled", "test_registry:DoubledLogitsQwen3")
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((checkpoint / name).read_bytes())
    edit_config_json(tmp_path, lambda hf: hf.update(model_type="qwen3-doubled"))
    runner = serve(tmp_path)
    assert type(runner.model) is DoubledLogitsQwen3
    torch.testing.assert_close(prompt_logits(runner), 2 * expected, rtol=0, atol=0)


def test_an_attention_backend_registered_by_one_line_is_the_one_the_runner_calls(checkpoint, monkeypatch):
    monkeypatch.setitem(ATTENTION_BACKENDS, "counting-reference", "test_registry:CountingReferenceAttention")
    runner = serve(checkpoint, attention_backend="counting-reference")
    prompt_logits(runner)
    assert isinstance(runner.backend, CountingReferenceAttention)
    assert runner.backend.num_calls == runner.config.model.num_layers


def test_a_linear_method_registered_for_a_quantization_holds_its_own_weights(checkpoint, tmp_path,
                                                                            monkeypatch):
    expected = prompt_logits(serve(checkpoint))
    monkeypatch.setitem(LINEAR_METHODS, "float64-test", "test_registry:Float64LinearMethod")
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((checkpoint / name).read_bytes())
    edit_config_json(tmp_path, lambda hf: hf.update(quantization_config={"quant_method": "float64-test"}))
    runner = serve(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    down_proj = runner.model.model.layers[1].mlp.down_proj.weight
    assert down_proj.dtype == torch.float64
    assert torch.equal(down_proj, tensors["model.layers.1.mlp.down_proj.weight"].double())
    assert runner.model.model.norm.weight.dtype == torch.float32, "norms stay in the model's dtype"
    torch.testing.assert_close(prompt_logits(runner), expected, rtol=1e-5, atol=1e-5)
