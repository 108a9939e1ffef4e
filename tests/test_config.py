"""Configs: the presets hold the published numbers, Hugging Face directories read back faithfully, and
every invalid combination is refused with a message that says what to change."""

from __future__ import annotations

import dataclasses
import json

import pytest
from tiny_models import tiny_hf_config

from core.config import (
    CacheConfig,
    ConfigError,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
)
from core.model_config import PRESETS


def small_model(**kwargs) -> ModelConfig:
    defaults = dict(name="small", hidden_size=64, intermediate_size=96, num_layers=2, num_heads=6,
                    num_kv_heads=3, head_dim=16, vocab_size=240, max_position_embeddings=1024)
    return ModelConfig(**{**defaults, **kwargs})


@pytest.fixture
def tiny_dir(tmp_path):
    tiny_hf_config(tie=True).save_pretrained(tmp_path)
    return tmp_path


def write_generation_config(directory, **fields) -> None:
    (directory / "generation_config.json").write_text(json.dumps(fields))


def edit_config_json(directory, edit) -> None:
    path = directory / "config.json"
    hf = json.loads(path.read_text())
    edit(hf)
    path.write_text(json.dumps(hf))


# --- presets ------------------------------------------------------------------------------------


def test_qwen3_14b_preset_has_the_published_architecture():
    m = ModelConfig.from_name("qwen3-14b")
    assert (m.hidden_size, m.intermediate_size, m.num_layers) == (5120, 17408, 40)
    assert (m.num_heads, m.num_kv_heads, m.head_dim) == (40, 8, 128)
    assert m.vocab_size == 151936
    assert m.rope_theta == 1_000_000.0 and m.rms_norm_eps == 1e-6
    assert m.max_position_embeddings == 40960
    assert not m.tie_word_embeddings
    assert m.dtype == "bfloat16"
    assert (m.q_size, m.kv_size) == (5120, 1024)
    assert m.weights_are_dummy and m.model_path is None


def test_qwen3_14b_kv_cache_costs_160_kib_per_token_in_bf16():
    m = PRESETS["qwen3-14b"]
    assert m.kv_bytes_per_token() == 160 * 1024  # 2 (K, V) * 40 layers * 8 heads * 128 * 2 bytes
    assert m.kv_bytes_per_token(tp_size=2) == 80 * 1024
    assert m.with_overrides(dtype="float32").kv_bytes_per_token() == 320 * 1024


def test_qwen3_tiny_preset_keeps_the_real_vocabulary_and_gqa():
    m = ModelConfig.from_name("qwen3-tiny")
    assert m.vocab_size == 151936
    assert (m.num_heads, m.num_kv_heads, m.head_dim) == (4, 2, 64)
    assert m.head_dim != m.hidden_size // m.num_heads
    assert m.tie_word_embeddings and m.dtype == "float32"
    assert ModelConfig.from_name("qwen3-tiny", num_layers=1).num_layers == 1


def test_unknown_preset_name_lists_the_presets():
    with pytest.raises(ConfigError, match="'qwen3-15b' is neither a preset .*qwen3-14b.*qwen3-tiny"):
        ModelConfig.from_name("qwen3-15b")


# --- from_pretrained ----------------------------------------------------------------------------


def test_from_pretrained_reads_a_saved_transformers_config(tiny_dir):
    m = ModelConfig.from_pretrained(tiny_dir)
    assert m.name == tiny_dir.name and m.model_path == str(tiny_dir)
    assert (m.hidden_size, m.intermediate_size, m.num_layers, m.vocab_size) == (64, 96, 2, 256)
    assert (m.num_heads, m.num_kv_heads) == (4, 2)
    assert m.head_dim == 32, "head_dim must come from the config, not hidden_size / heads"
    assert m.tie_word_embeddings
    assert m.max_position_embeddings == 1024 and m.rms_norm_eps == 1e-6
    assert not m.weights_are_dummy


@pytest.mark.parametrize("recorded, dtype", [
    ({}, "bfloat16"),
    ({"dtype": "float32"}, "float32"),
    ({"torch_dtype": "torch.float16"}, "float16"),
    ({"torch_dtype": "auto"}, "bfloat16"),
], ids=["absent", "dtype", "older_torch_dtype", "auto"])
def test_dtype_is_read_from_either_config_key(tiny_dir, recorded, dtype):
    edit_config_json(tiny_dir, lambda hf: hf.update(recorded))
    assert ModelConfig.from_pretrained(tiny_dir).dtype == dtype


def test_rope_theta_is_read_from_rope_parameters(tiny_dir):
    hf = json.loads((tiny_dir / "config.json").read_text())
    assert "rope_theta" not in hf, "transformers 5 writes rope_theta only inside rope_parameters"
    assert ModelConfig.from_pretrained(tiny_dir).rope_theta == 10000.0


def test_top_level_rope_theta_of_older_configs_is_read(tiny_dir):
    def older(hf):
        del hf["rope_parameters"]
        hf["rope_theta"] = 5e5

    edit_config_json(tiny_dir, older)
    assert ModelConfig.from_pretrained(tiny_dir).rope_theta == 5e5


def test_head_dim_defaults_to_hidden_over_heads_when_absent(tiny_dir):
    edit_config_json(tiny_dir, lambda hf: hf.pop("head_dim"))
    assert ModelConfig.from_pretrained(tiny_dir).head_dim == 64 // 4


def test_overrides_replace_checkpoint_values(tiny_dir):
    m = ModelConfig.from_pretrained(tiny_dir, dtype="bfloat16", name="mine", load_format="dummy")
    assert (m.dtype, m.name, m.load_format) == ("bfloat16", "mine", "dummy")
    assert m.weights_are_dummy


def test_any_field_can_be_overridden_as_for_a_preset(tiny_dir):
    assert ModelConfig.from_name("qwen3-tiny", max_position_embeddings=512).max_position_embeddings == 512
    m = ModelConfig.from_pretrained(tiny_dir, max_position_embeddings=512, tie_word_embeddings=False)
    assert (m.max_position_embeddings, m.tie_word_embeddings) == (512, False)


def test_generation_config_without_sampling_means_greedy(tiny_dir):
    write_generation_config(tiny_dir, do_sample=False, temperature=0.7, top_p=0.8, top_k=20,
                            repetition_penalty=1.05, eos_token_id=[151645, 151643])
    gen = ModelConfig.from_pretrained(tiny_dir).generation
    assert (gen.temperature, gen.top_p, gen.top_k) == (0.0, 1.0, 0)
    assert gen.repetition_penalty == 1.05
    assert gen.eos_token_ids == (151645, 151643)


def test_generation_config_omitting_do_sample_means_greedy(tiny_dir):
    write_generation_config(tiny_dir, temperature=0.7)
    assert ModelConfig.from_pretrained(tiny_dir).generation.temperature == 0.0


def test_generation_config_with_sampling_gives_its_defaults(tiny_dir):
    write_generation_config(tiny_dir, do_sample=True, temperature=0.6, top_p=0.95, top_k=20, min_p=0.05,
                            eos_token_id=7)
    gen = ModelConfig.from_pretrained(tiny_dir).generation
    assert (gen.temperature, gen.top_p, gen.top_k, gen.min_p) == (0.6, 0.95, 20, 0.05)
    assert gen.eos_token_ids == (7,)


def test_eos_list_of_config_json_gives_the_first_as_eos_and_all_as_stop_ids(tiny_dir):
    (tiny_dir / "generation_config.json").unlink(missing_ok=True)
    edit_config_json(tiny_dir, lambda hf: hf.update(eos_token_id=[5, 6], bos_token_id=4))
    m = ModelConfig.from_pretrained(tiny_dir)
    assert (m.bos_token_id, m.eos_token_id) == (4, 5)
    assert m.generation.eos_token_ids == (5, 6)
    assert m.generation.temperature == 1.0, "without generation_config.json the API defaults apply"


def test_missing_config_json_names_the_directory(tmp_path):
    with pytest.raises(ConfigError, match=f"{tmp_path} is not a model directory: it has no config.json"):
        ModelConfig.from_pretrained(tmp_path)


def test_unparseable_config_json_names_the_file(tiny_dir):
    (tiny_dir / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read .*config.json"):
        ModelConfig.from_pretrained(tiny_dir)


def test_other_model_type_is_refused_naming_it(tiny_dir):
    edit_config_json(tiny_dir, lambda hf: hf.update(model_type="llama"))
    with pytest.raises(ConfigError, match="model_type is 'llama'; Cadence serves qwen3"):
        ModelConfig.from_pretrained(tiny_dir)


def test_model_type_and_quantization_are_read_from_config_json(tiny_dir):
    m = ModelConfig.from_pretrained(tiny_dir)
    assert (m.model_type, m.quantization) == ("qwen3", None)
    with pytest.raises(ConfigError, match="model small: model_type 'llama' is not served: use one of qwen3"):
        small_model(model_type="llama")


def test_quantized_checkpoint_of_an_unsupported_format_is_refused_naming_it(tiny_dir):
    edit_config_json(tiny_dir, lambda hf: hf.update(
        quantization_config={"quant_method": "awq", "bits": 4}))
    with pytest.raises(ConfigError, match="config.json: quantization 'awq' is not supported: "
                                          "Cadence loads unquantized checkpoints, fp8"):
        ModelConfig.from_pretrained(tiny_dir)


@pytest.mark.parametrize("field", ["hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads", "vocab_size"])
def test_missing_required_field_is_named(tiny_dir, field):
    edit_config_json(tiny_dir, lambda hf: hf.pop(field))
    with pytest.raises(ConfigError, match=f"config.json lacks the field '{field}'"):
        ModelConfig.from_pretrained(tiny_dir)


@pytest.mark.parametrize("edit, message", [
    ({"attention_bias": True}, "attention_bias=true is not supported"),
    ({"use_sliding_window": True}, "use_sliding_window=true is not supported"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "rope_type 'linear' is not supported"),
], ids=["attention_bias", "sliding_window", "rope_scaling"])
def test_unsupported_architecture_options_are_refused(tiny_dir, edit, message):
    edit_config_json(tiny_dir, lambda hf: hf.update(edit))
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_pretrained(tiny_dir)


# --- invalid combinations -----------------------------------------------------------------------


@pytest.mark.parametrize("model, what", [
    (PRESETS["qwen3-14b"], "num_attention_heads 40"),
    (small_model(num_heads=6, num_kv_heads=2), "num_key_value_heads 2"),
    (small_model(intermediate_size=100), "intermediate_size 100"),
    (small_model(vocab_size=256), "vocab_size 256"),
], ids=["heads", "kv_heads", "intermediate", "vocab"])
def test_tp_that_does_not_divide_the_model_says_which_tp_sizes_work(model, what):
    with pytest.raises(ConfigError, match=f"tp_size 3 does not divide {what} of model {model.name}") as info:
        EngineConfig(model=model, parallel=ParallelConfig(tp_size=3))
    suggested = json.loads(str(info.value).split("use a tp_size in ")[1])
    assert suggested and 3 not in suggested
    for tp in suggested:
        EngineConfig(model=model, parallel=ParallelConfig(tp_size=tp))  # each suggestion is valid


def test_qwen3_14b_serves_at_tp_1_2_4_8():
    for tp in (1, 2, 4, 8):
        EngineConfig(model=PRESETS["qwen3-14b"], parallel=ParallelConfig(tp_size=tp))


def test_unknown_dtype_lists_the_known_ones():
    with pytest.raises(ConfigError, match="unknown dtype 'int8': use one of float32, bfloat16, float16"):
        PRESETS["qwen3-tiny"].with_overrides(dtype="int8")


def test_heads_not_a_multiple_of_kv_heads_is_refused():
    with pytest.raises(ConfigError, match="num_attention_heads 6 is not a multiple of num_key_value_heads 4"):
        small_model(num_kv_heads=4)


def test_non_positive_size_is_named():
    with pytest.raises(ConfigError, match="head_dim must be positive, got 0"):
        small_model(head_dim=0)


@pytest.mark.parametrize("block_size", [0, 3, 24, 100])
def test_block_size_must_be_a_power_of_two(block_size):
    with pytest.raises(ConfigError, match=f"block_size must be a power of two .*got {block_size}"):
        CacheConfig(block_size=block_size)


def test_block_size_over_256_is_refused():
    with pytest.raises(ConfigError, match="block_size 512 is too large: use at most 256"):
        CacheConfig(block_size=512)


@pytest.mark.parametrize("block_size", [1, 16, 32, 256])
def test_power_of_two_block_sizes_are_accepted(block_size):
    assert CacheConfig(block_size=block_size).block_size == block_size


def test_max_model_len_over_max_positions_says_to_lower_it():
    with pytest.raises(ConfigError, match=r"max_model_len 40961 exceeds the model's context of 40960 "
                                          r"positions \(max_position_embeddings\): lower --max-model-len"):
        EngineConfig(model=PRESETS["qwen3-tiny"], scheduler=SchedulerConfig(max_model_len=40961))


def test_max_model_len_defaults_to_max_positions():
    assert EngineConfig(model=PRESETS["qwen3-tiny"]).max_model_len == 40960
    config = EngineConfig(model=PRESETS["qwen3-tiny"], scheduler=SchedulerConfig(max_model_len=4096))
    assert config.max_model_len == 4096


def test_unknown_device_is_refused():
    with pytest.raises(ConfigError, match="unknown device 'tpu': use cpu or cuda"):
        EngineConfig(model=PRESETS["qwen3-tiny"], device="tpu")


def test_safetensors_format_without_a_directory_is_refused():
    with pytest.raises(ConfigError, match="load format safetensors needs a model directory"):
        PRESETS["qwen3-tiny"].with_overrides(load_format="safetensors")


@pytest.mark.parametrize("config, field", [
    (PRESETS["qwen3-14b"], "hidden_size"),
    (PRESETS["qwen3-14b"].generation, "temperature"),
    (ParallelConfig(), "tp_size"),
    (CacheConfig(), "block_size"),
    (SchedulerConfig(), "max_num_seqs"),
    (EngineConfig(model=PRESETS["qwen3-tiny"]), "model"),
], ids=["model", "generation", "parallel", "cache", "scheduler", "engine"])
def test_configs_are_frozen(config, field):
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, field, 1)


def test_with_overrides_makes_a_new_config_and_leaves_the_preset_alone():
    changed = PRESETS["qwen3-14b"].with_overrides(num_layers=2)
    assert changed.num_layers == 2 and PRESETS["qwen3-14b"].num_layers == 40
