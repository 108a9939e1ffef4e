"""Fp8LinearMethod on the CPU: a fine-grained FP8 checkpoint computes exactly what its dequantized
float32 twin computes (the CPU multiplies the dequantized weight, so the two runs share every float
operation), `--quantization fp8` makes at load the checkpoint an offline quantizer makes, modules
left unconverted stay in the model's dtype, and shards off the 128 x 128 blocks are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from plans import Chunk, make_plan
from tiny_models import build_tiny_fp8_checkpoints, fp8_dequantize_blocks, fp8_quantize_blocks

from core.config import CacheConfig, EngineConfig, ModelConfig
from core.execution.distributed import TPGroup
from core.execution.model.fp8_format import (
    FP8_DTYPE,
    dequantize_weight,
    quantize_activations_reference,
    quantize_weight,
    reference_matmul,
)
from core.execution.model.fp8_linear import Fp8LinearMethod
from core.execution.model.qwen3 import Qwen3ForCausalLM
from core.execution.runner import ModelRunner

BLOCK_SIZE = 16


def runner_for(model: ModelConfig, num_pages: int = 16) -> ModelRunner:
    config = EngineConfig(model=model, cache=CacheConfig(block_size=BLOCK_SIZE, num_pages=num_pages))
    return ModelRunner(config, show_progress=False)


def greedy_run(runner: ModelRunner, prompt: list[int], num_tokens: int
               ) -> tuple[list[int], list[torch.Tensor]]:
    """Prefill then decode greedily; the tokens and every step's logits."""
    pages = [3, 0, 5, 1]
    tokens, all_logits = [], []
    plan = make_plan([Chunk(prompt, 0, pages)], BLOCK_SIZE)
    for step in range(num_tokens):
        logits, _ = runner.forward_logits(plan)
        all_logits.append(logits[0].clone())
        tokens.append(int(logits[0].argmax()))
        plan = make_plan([Chunk([tokens[-1]], len(prompt) + step, pages)], BLOCK_SIZE, step_id=step + 1)
    return tokens, all_logits


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return build_tiny_fp8_checkpoints(tmp_path_factory.mktemp("fp8"), seed=4)


PROMPT = np.random.default_rng(0).integers(0, 512, size=37).tolist()


# --- the format ------------------------------------------------------------------------------------


def test_quantize_weight_is_the_block_format_by_its_definition():
    weight = torch.randn(300, 200) * torch.logspace(-3, 1, 300)[:, None]  # ragged blocks, wide range
    quantized, scale_inv = quantize_weight(weight)
    expected, expected_scale = fp8_quantize_blocks(weight)
    assert quantized.dtype == FP8_DTYPE and scale_inv.shape == (3, 2)
    assert torch.equal(quantized.float(), expected.float()) and torch.equal(scale_inv, expected_scale)
    dequantized = dequantize_weight(quantized, scale_inv)
    assert torch.equal(dequantized, fp8_dequantize_blocks(expected, expected_scale))
    # Each block's largest value maps to 448; e4m3 keeps 3 mantissa bits (error <= 1/16 relative), and
    # below 2**-6 its subnormals are 2**-9 apart (error <= 2**-10 of the block's scale).
    scales = scale_inv.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :200]
    error = (dequantized - weight).abs()
    assert torch.all(error <= torch.maximum(weight.abs() / 16, scales * 2**-10))


def test_activation_groups_scale_each_token_and_128_columns_alone():
    x = torch.randn(3, 300)
    x[1, :128] *= 1000  # one loud group must not coarsen the others
    quantized, scales = quantize_activations_reference(x)
    assert scales.shape == (3, 3)
    assert torch.allclose(scales[:, 0] * 448, x[:, :128].abs().amax(dim=1))
    quiet = torch.stack([x[1, 128:256].abs().max(), x[1, 256:].abs().max()])
    assert torch.allclose(scales[1, 1:] * 448, quiet), "the loud group's scale stays in its own group"
    group_scales = scales.repeat_interleave(128, 1)[:, :300]
    error = (quantized.float() * group_scales - x).abs()
    assert torch.all(error <= torch.maximum(x.abs() / 16, group_scales * 2**-10))


def test_reference_matmul_without_activation_quantization_is_the_dequantized_product():
    x, weight = torch.randn(5, 256), torch.randn(384, 256) * 0.05
    quantized, scale_inv = quantize_weight(weight)
    expected = x @ dequantize_weight(quantized, scale_inv).t()
    assert torch.equal(reference_matmul(x, quantized, scale_inv, quantize_activations=False), expected)
    close = reference_matmul(x, quantized, scale_inv)
    assert float((close - expected).abs().max() / expected.abs().max()) < 0.05


# --- checkpoints through the runner ----------------------------------------------------------------


def test_fp8_checkpoint_logits_equal_its_dequantized_float32_twin_exactly(checkpoints):
    fp8 = runner_for(ModelConfig.from_pretrained(checkpoints["fp8"], dtype="float32"))
    layer = fp8.model.model.layers[1]
    assert layer.mlp.down_proj.weight.dtype == FP8_DTYPE
    assert layer.self_attn.qkv_proj.weight_scale_inv.shape == (1024 // 128, 256 // 128)
    assert fp8.model.model.embed_tokens.weight.dtype == torch.float32, "embeddings stay in the model's dtype"
    reference = runner_for(ModelConfig.from_pretrained(checkpoints["dequantized"], dtype="float32"))
    ours, our_logits = greedy_run(fp8, PROMPT, 12)
    theirs, their_logits = greedy_run(reference, PROMPT, 12)
    assert ours == theirs
    for step, (a, b) in enumerate(zip(our_logits, their_logits)):
        assert torch.equal(a, b), f"step {step}: logits differ by {float((a - b).abs().max()):.3g}"


def test_quantization_fp8_at_load_equals_the_checkpoint_quantized_offline(checkpoints):
    at_load = ModelConfig.from_pretrained(checkpoints["bf16"], dtype="float32").quantized_at_load("fp8")
    assert at_load.quantization == "fp8" and not at_load.quantization_config.checkpoint_is_quantized
    runner = runner_for(at_load)
    offline = runner_for(ModelConfig.from_pretrained(checkpoints["fp8"], dtype="float32"))
    for ours, theirs in zip(runner.model.parameters(), offline.model.parameters()):
        assert ours.dtype == theirs.dtype and torch.equal(ours.float(), theirs.float())
    assert greedy_run(runner, PROMPT, 6)[0] == greedy_run(offline, PROMPT, 6)[0]


def test_modules_to_not_convert_stay_in_the_model_dtype(tmp_path):
    skipped = ("model.layers.1.mlp.down_proj", "model.layers.0.self_attn")
    paths = build_tiny_fp8_checkpoints(tmp_path, seed=5, modules_to_not_convert=skipped)
    fp8 = runner_for(ModelConfig.from_pretrained(paths["fp8"], dtype="float32"))
    layers = fp8.model.model.layers
    assert layers[1].mlp.down_proj.weight.dtype == torch.float32
    assert not hasattr(layers[1].mlp.down_proj, "weight_scale_inv")
    assert layers[0].self_attn.qkv_proj.weight.dtype == torch.float32
    assert layers[0].self_attn.o_proj.weight.dtype == torch.float32
    assert layers[0].mlp.down_proj.weight.dtype == FP8_DTYPE
    reference = runner_for(ModelConfig.from_pretrained(paths["dequantized"], dtype="float32"))
    assert greedy_run(fp8, PROMPT, 6)[0] == greedy_run(reference, PROMPT, 6)[0]


def test_a_packed_layer_half_left_unconverted_is_refused_naming_both(checkpoints, tmp_path):
    config = json.loads((checkpoints["fp8"] / "config.json").read_text())
    config["quantization_config"]["modules_to_not_convert"] = ["model.layers.0.self_attn.k_proj"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = ModelConfig.from_pretrained(tmp_path, dtype="float32")
    with pytest.raises(ValueError, match="leaves model.layers.0.self_attn.k_proj unquantized but not "
                                         "model.layers.0.self_attn.q_proj, model.layers.0.self_attn.v_proj"):
        Qwen3ForCausalLM(model, TPGroup())


# --- tensor-parallel shards on the blocks ----------------------------------------------------------


def test_tp2_shards_of_the_tiny_fp8_model_take_their_scale_blocks(checkpoints):
    model = ModelConfig.from_pretrained(checkpoints["fp8"], dtype="float32")
    slices = Qwen3ForCausalLM(model, TPGroup(rank=1, size=2)).checkpoint_slices()
    _, k_scale = slices["model.layers.0.self_attn.k_proj.weight_scale_inv"]
    # k_proj has 256 rows: rank 1 holds rows 128..256, its scale row 1, placed after q's 2 scale rows.
    assert (k_scale.full_shape, k_scale.start, k_scale.length, k_scale.dest_offset) == ((2, 2), 1, 1, 2)
    _, down_scale = slices["model.layers.0.mlp.down_proj.weight_scale_inv"]
    assert (down_scale.dim, down_scale.start, down_scale.length) == (1, 2, 2)


def test_a_shard_off_the_128_blocks_is_refused_naming_the_matrix():
    # qwen3-tiny: two KV heads of 64, so at TP=2 each rank holds 64 rows of k_proj.
    model = ModelConfig.from_name("qwen3-tiny").quantized_at_load("fp8")
    with pytest.raises(ValueError, match=r"model.layers.0.self_attn.k_proj: this rank holds rows 64..128 "
                                         r"of 128, placed at 128 in its layer, which do not fall on the "
                                         r"128 x 128 blocks"):
        Qwen3ForCausalLM(model, TPGroup(rank=1, size=2)).checkpoint_slices()


def test_quantization_fp8_on_a_preset_serves_fp8_dummy_weights():
    model = ModelConfig.from_name("qwen3-tiny").quantized_at_load("fp8")
    runner = runner_for(model, num_pages=64)
    down = runner.model.model.layers[0].mlp.down_proj
    assert down.weight.dtype == FP8_DTYPE and down.weight_scale_inv.shape == (1, 3)
    assert isinstance(down.linear_method, Fp8LinearMethod)
    tokens, logits = greedy_run(runner, PROMPT, 4)
    assert all(torch.isfinite(step).all() for step in logits)
    # The same dummy weights unquantized give close logits: the quantization is of those weights.
    bf = runner_for(ModelConfig.from_name("qwen3-tiny"), num_pages=64)
    theirs = greedy_run(bf, PROMPT, 1)[1][0]
    assert float((logits[0] - theirs).abs().max() / theirs.abs().max()) < 0.1

