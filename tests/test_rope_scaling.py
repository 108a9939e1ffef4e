"""YaRN RoPE scaling (core/rope_scaling.py, core/execution/model/yarn.py): the tables are
transformers', bit for bit; a tiny checkpoint that asks for YaRN computes what transformers'
Qwen3ForCausalLM computes past its original context; what Cadence cannot compute is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from plans import Chunk, make_plan
from tiny_models import build_tiny_checkpoint

from core.config import CacheConfig, ConfigError, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.model.layers import RotaryEmbedding
from core.execution.model.yarn import yarn_attention_factor, yarn_inv_freq
from core.execution.runner import ModelRunner
from core.rope_scaling import RopeScalingError, YarnScaling, read_rope_scaling

QWEN3_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


@pytest.mark.parametrize(("head_dim", "theta", "max_positions", "fields"), [
    (128, 1_000_000.0, 40960, QWEN3_YARN),  # Qwen3's documented setting
    (32, 10000.0, 256, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    (64, 10000.0, 4096, {"rope_type": "yarn", "factor": 2.5, "original_max_position_embeddings": 1024,
                         "beta_fast": 16, "beta_slow": 2, "truncate": False}),
    (64, 500000.0, 8192, {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024,
                          "mscale": 0.707, "mscale_all_dim": 1.0}),
    (64, 10000.0, 8192, {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024,
                         "attention_factor": 1.25}),
])
def test_yarn_tables_are_transformers(head_dim, theta, max_positions, fields):
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = Qwen3Config(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                     max_position_embeddings=max_positions, rope_parameters={"rope_theta": theta, **fields})
    their_inv_freq, their_factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    scaling = read_rope_scaling({"rope_scaling": fields, "max_position_embeddings": max_positions}, "config")
    assert torch.equal(yarn_inv_freq(head_dim, theta, scaling), their_inv_freq.float())
    assert yarn_attention_factor(scaling) == pytest.approx(their_factor, abs=0)
    rope = RotaryEmbedding(head_dim, 300, theta, scaling)
    freqs = torch.outer(torch.arange(300, dtype=torch.float32), their_inv_freq.float())
    assert torch.equal(rope.cos, freqs.cos() * their_factor)
    assert torch.equal(rope.sin, freqs.sin() * their_factor)


def test_a_yarn_checkpoint_computes_transformers_logits_past_its_original_context(tmp_path):
    """Original context 64, factor 4: a prompt of 150 and 60 decode steps reach position 210."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    hf = build_tiny_checkpoint(tmp_path, seed=4, rope_parameters=yarn)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["rope_parameters"]["rope_type"] == "yarn"  # what transformers 5 writes
    model = ModelConfig.from_pretrained(tmp_path, dtype="float32")
    assert model.rope_scaling == YarnScaling(4.0, 64)
    runner = ModelRunner(EngineConfig(model=model, cache=CacheConfig(block_size=16, num_pages=32)),
                         show_progress=False)
    rng = np.random.default_rng(4)
    prompt = rng.integers(0, 256, size=150).tolist()
    pages = rng.permutation(32)[:14].tolist()
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), use_cache=True)
        theirs, past = out.logits[0, -1], out.past_key_values
        ours, _ = runner.forward_logits(make_plan([Chunk(prompt, 0, pages)], 16))
        for step in range(60):
            error = float((ours[0] - theirs).abs().max() / theirs.abs().max())
            assert error < 1e-4, f"position {len(prompt) + step}: relative logits error {error:.2e}"
            token = int(theirs.argmax())
            out = hf(torch.tensor([[token]]), past_key_values=past, use_cache=True)
            theirs, past = out.logits[0, -1], out.past_key_values
            ours, _ = runner.forward_logits(make_plan([Chunk([token], len(prompt) + step, pages)], 16,
                                                      step_id=step + 1))


def test_the_context_is_the_scaled_one_and_longer_is_refused_naming_it():
    qwen = ModelConfig(name="q", hidden_size=64, intermediate_size=96, num_layers=1, num_heads=4,
                       num_kv_heads=2, head_dim=32, vocab_size=256, max_position_embeddings=40960,
                       rope_scaling=read_rope_scaling({"rope_scaling": QWEN3_YARN}, "config"))
    assert qwen.max_positions == 131072
    assert EngineConfig(model=qwen).max_model_len == 131072
    assert EngineConfig(model=qwen, scheduler=SchedulerConfig(max_model_len=131072)).max_model_len == 131072
    with pytest.raises(ConfigError, match=r"context of 131072 positions \(YaRN: 32768 x 4\)"):
        EngineConfig(model=qwen, scheduler=SchedulerConfig(max_model_len=131073))


@pytest.mark.parametrize(("hf", "expected"), [
    ({}, None),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, None),
    ({"rope_scaling": None}, None),
    ({"rope_scaling": {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 100}},
     YarnScaling(2.0, 100)),
    ({"rope_parameters": {"rope_type": "yarn", "original_max_position_embeddings": 100},
      "max_position_embeddings": 400}, YarnScaling(4.0, 100)),  # the factor transformers derives
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2}, "max_position_embeddings": 512},
     YarnScaling(2.0, 512)),
])
def test_rope_scaling_is_read_from_either_field(hf, expected):
    assert read_rope_scaling(hf, "config.json") == expected


@pytest.mark.parametrize(("hf", "message"), [
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     r"rope_scaling.rope_type 'linear' is not supported"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, r"rope_parameters.rope_type 'dynamic'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, r"'default' and 'yarn'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 64}},
     r"factor must be a number >= 1, got 0.5"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": "x"}},
     r"original_max_position_embeddings must be a positive integer"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64,
                       "beta_fast": "fast"}}, r"beta_fast must be a number"),
    ({"rope_scaling": "yarn"}, r"rope_scaling must be an object"),
])
def test_what_cannot_be_computed_is_refused_naming_the_field(hf, message):
    with pytest.raises(RopeScalingError, match=message):
        read_rope_scaling(hf, "config.json")


def test_a_checkpoint_asking_for_another_scaling_is_refused_at_load(tmp_path):
    build_tiny_checkpoint(tmp_path, seed=5)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "longrope", "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"config.json: rope_scaling.rope_type 'longrope' is not supported"):
        ModelConfig.from_pretrained(tmp_path)


# --- --hf-overrides (vLLM's flag; SGLang's --json-model-override-args) ----------------------------

def serve_config(*flags: str) -> EngineConfig:
    from api import cli
    from procs.args import config_from_args

    return config_from_args(cli.build_parser().parse_args(["serve", "--device", "cpu", *flags]))


def test_hf_overrides_give_a_preset_yarn_and_its_longer_context():
    yarn = json.dumps({"rope_scaling": QWEN3_YARN})
    for flag in ("--hf-overrides", "--json-model-override-args"):
        config = serve_config(flag, yarn)
        assert config.model.rope_scaling == YarnScaling(4.0, 32768)
        assert config.max_model_len == 131072
    assert serve_config().max_model_len == 40960 and serve_config().model.rope_scaling is None


def test_the_model_cards_rope_scaling_flag_is_the_same_yarn(tmp_path):
    """Qwen3's model card serves 131,072 tokens on vLLM with --rope-scaling; it runs unchanged here,
    on a preset and on a checkpoint (its max_position_embeddings kept), and once is enough."""
    config = serve_config("--rope-scaling", json.dumps(QWEN3_YARN), "--max-model-len", "131072")
    assert config.model.rope_scaling == YarnScaling(4.0, 32768) and config.max_model_len == 131072
    build_tiny_checkpoint(tmp_path, seed=6)
    yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024}
    checkpoint = serve_config("--model", str(tmp_path), "--rope-scaling", json.dumps(yarn))
    assert checkpoint.model.rope_scaling == YarnScaling(2.0, 1024) and checkpoint.max_model_len == 2048
    with pytest.raises(ConfigError, match="--rope-scaling and --hf-overrides both set"):
        serve_config("--rope-scaling", json.dumps(QWEN3_YARN), "--hf-overrides",
                     json.dumps({"rope_scaling": QWEN3_YARN}))


def test_hf_overrides_replace_a_checkpoints_config_fields(tmp_path):
    build_tiny_checkpoint(tmp_path, seed=6)
    yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024}
    config = serve_config("--model", str(tmp_path), "--hf-overrides", json.dumps({"rope_parameters": yarn}))
    assert config.model.rope_scaling == YarnScaling(2.0, 1024) and config.max_model_len == 2048


@pytest.mark.parametrize(("value", "message"), [
    ('{"num_hidden_layers": 2}', r"the preset qwen3-tiny takes only max_position_embeddings, rope_scaling, "
                                 r"rope_parameters; got num_hidden_layers"),
    ('{"rope_scaling": {"rope_type": "linear", "factor": 2}}',
     r"--hf-overrides: rope_scaling.rope_type 'linear'"),
    ('{"max_position_embeddings": "long"}', r"max_position_embeddings must be an integer, got 'long'"),
])
def test_bad_hf_overrides_are_refused_naming_the_field(value, message):
    with pytest.raises(ConfigError, match=message):
        serve_config("--hf-overrides", value)


@pytest.mark.parametrize("value", ["{not json", "[1, 2]"])
def test_hf_overrides_that_are_not_a_json_object_stop_the_parser(value, capsys):
    with pytest.raises(SystemExit):
        serve_config("--hf-overrides", value)
    assert "--hf-overrides" in capsys.readouterr().err
