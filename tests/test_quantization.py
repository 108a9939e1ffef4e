"""A checkpoint's quantization_config is read field by field: the fine-grained FP8 format Qwen publishes
is served, anything Cadence would serve wrongly is refused at start naming the field, and
`--quantization fp8` quantizes an unquantized model at load but never re-quantizes a quantized one."""

from __future__ import annotations

import argparse
import json
import re

import pytest
from tiny_models import tiny_hf_config

from core.config import ConfigError, EngineConfig, ModelConfig, ParallelConfig
from core.quantization import Fp8Config
from core.registry import LINEAR_METHODS
from ipc import codec
from ipc.process_specs import ExecutorSpec
from procs.args import add_engine_args, config_from_args

QWEN3_14B_FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                 "weight_block_size": [128, 128]}


@pytest.fixture
def model_dir(tmp_path):
    tiny_hf_config().save_pretrained(tmp_path)
    return tmp_path


def with_quantization_config(directory, fields: dict):
    path = directory / "config.json"
    hf = json.loads(path.read_text())
    hf["quantization_config"] = fields
    path.write_text(json.dumps(hf))
    return directory


def test_the_qwen3_fp8_quantization_config_is_served(model_dir):
    model = ModelConfig.from_pretrained(with_quantization_config(model_dir, QWEN3_14B_FP8))
    assert model.quantization == "fp8"
    assert model.quantization_config == Fp8Config(modules_to_not_convert=(), checkpoint_is_quantized=True)


def test_transformers_own_fp8_fields_at_their_defaults_are_served(model_dir):
    fields = {**QWEN3_14B_FP8, "dequantize": False, "scale_fmt": "float", "expert_dtype": "fp8",
              "modules_to_convert": None, "ignored_layers": ["lm_head", "model.layers.0.mlp"]}
    fields.pop("fmt")  # e4m3 when left out
    model = ModelConfig.from_pretrained(with_quantization_config(model_dir, fields))
    assert model.quantization_config.modules_to_not_convert == ("lm_head", "model.layers.0.mlp")


@pytest.mark.parametrize("field,value,message", [
    ("activation_scheme", "static", "quantization_config.activation_scheme is 'static'; Cadence serves "
                                    "'dynamic' only"),
    ("weight_block_size", [64, 64], "quantization_config.weight_block_size is [64, 64]; Cadence serves "
                                    "fp8 checkpoints with [128, 128] blocks only"),
    ("weight_block_size", None, "quantization_config.weight_block_size is None"),
    ("fmt", "e5m2", "quantization_config.fmt is 'e5m2'; Cadence serves 'e4m3' only"),
    ("scale_fmt", "ue8m0", "quantization_config.scale_fmt is 'ue8m0'"),
    ("dequantize", True, "quantization_config.dequantize is True"),
    ("modules_to_convert", ["model.embed_tokens"], "quantization_config.modules_to_convert"),
    ("modules_to_not_convert", ["model.layers.*.mlp"],
     "quantization_config.modules_to_not_convert entry 'model.layers.*.mlp' is a pattern"),
    ("modules_to_not_convert", "lm_head", "quantization_config.modules_to_not_convert must be a list"),
    ("kv_cache_scheme", {"num_bits": 8}, "quantization_config.kv_cache_scheme is not a field Cadence knows"),
])
def test_an_fp8_config_cadence_would_serve_wrongly_is_refused_naming_the_field(model_dir, field, value,
                                                                               message):
    with_quantization_config(model_dir, {**QWEN3_14B_FP8, field: value})
    with pytest.raises(ConfigError, match=re.escape(f"config.json: {message}")):
        ModelConfig.from_pretrained(model_dir)


def test_unconverted_modules_match_whole_names_prefixes_and_suffixes():
    fmt = Fp8Config(modules_to_not_convert=("model.layers.1", "down_proj", "model.layers.0.self_attn.q_proj"))
    assert fmt.leaves_unconverted("model.layers.1.mlp.gate_proj")
    assert not fmt.leaves_unconverted("model.layers.11.mlp.gate_proj"), "a prefix ends at a dot"
    assert fmt.leaves_unconverted("model.layers.7.mlp.down_proj")
    assert fmt.leaves_unconverted("model.layers.0.self_attn.q_proj")
    assert not fmt.leaves_unconverted("model.layers.0.self_attn.k_proj")


def test_fp8_and_only_fp8_carries_its_format():
    preset = ModelConfig.from_name("qwen3-tiny")
    with pytest.raises(ConfigError, match="fp8, and only fp8, needs its Fp8Config"):
        preset.with_overrides(quantization="fp8")
    with pytest.raises(ConfigError, match="fp8, and only fp8, needs its Fp8Config"):
        preset.with_overrides(quantization_config=Fp8Config())


def engine_args(*flags: str) -> argparse.Namespace:
    return add_engine_args(argparse.ArgumentParser()).parse_args(["--device", "cpu", *flags])


def test_quantization_fp8_quantizes_a_preset_at_load():
    model = config_from_args(engine_args("--model", "qwen3-14b", "--load-format", "dummy",
                                         "--quantization", "fp8")).model
    assert (model.name, model.quantization) == ("qwen3-14b", "fp8")
    assert model.quantization_config == Fp8Config(checkpoint_is_quantized=False)
    assert config_from_args(engine_args("--model", "qwen3-14b")).model.quantization is None


def test_the_command_line_offers_only_what_can_be_quantized_at_load():
    with pytest.raises(SystemExit):
        engine_args("--quantization", "awq")


def test_quantization_fp8_keeps_an_fp8_checkpoint_as_it_is(model_dir):
    with_quantization_config(model_dir, {**QWEN3_14B_FP8, "modules_to_not_convert": ["lm_head"]})
    model = config_from_args(engine_args("--model", str(model_dir), "--quantization", "fp8")).model
    assert model.quantization_config == Fp8Config(modules_to_not_convert=("lm_head",),
                                                  checkpoint_is_quantized=True)


def test_quantization_of_a_checkpoint_quantized_otherwise_is_refused(model_dir, monkeypatch):
    monkeypatch.setitem(LINEAR_METHODS, "int8-test", "core.execution.model.unquantized_linear:"
                                                     "UnquantizedLinearMethod")
    with_quantization_config(model_dir, {"quant_method": "int8-test"})
    with pytest.raises(ConfigError, match=f"--quantization fp8: model {model_dir.name} is already quantized "
                                          "as 'int8-test'; serve it without --quantization"):
        config_from_args(engine_args("--model", str(model_dir), "--quantization", "fp8"))


def test_the_fp8_format_travels_to_the_executors(model_dir):
    config = config_from_args(engine_args("--model", str(with_quantization_config(
        model_dir, {**QWEN3_14B_FP8, "modules_to_not_convert": ["model.layers.1.mlp"]}))))
    spec = ExecutorSpec(config, 0, 0, "cpu", "ipc://a", "ipc://b", "ring", "", "gloo", 1.0)
    assert codec.decode(codec.encode(spec)).config == config


def test_a_tensor_parallel_size_off_the_fp8_blocks_is_refused_before_anything_starts():
    tiny = ModelConfig.from_name("qwen3-tiny").quantized_at_load("fp8")
    with pytest.raises(ConfigError, match=re.escape(
            "model qwen3-tiny in FP8: tp_size 2 would give each rank 64 of k_proj's and v_proj's rows 128, "
            "not whole 128 x 128 FP8 blocks: use a tp_size in [1]")):
        EngineConfig(model=tiny, parallel=ParallelConfig(tp_size=2))
    assert EngineConfig(model=tiny.with_overrides(quantization=None, quantization_config=None),
                        parallel=ParallelConfig(tp_size=2)).parallel.tp_size == 2, "bf16 splits as before"
    qwen3_14b = ModelConfig.from_name("qwen3-14b").quantized_at_load("fp8")
    for tp in (1, 2, 4, 8):  # 40 heads, 8 KV heads of 128, intermediate 17,408 = 136 blocks
        assert EngineConfig(model=qwen3_14b, parallel=ParallelConfig(tp_size=tp)).parallel.tp_size == tp
