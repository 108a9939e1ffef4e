"""Tiny Qwen3 checkpoints built with transformers and saved as real safetensors directories: in float32,
and as fine-grained FP8 checkpoints beside their bf16 and dequantized twins.

transformers is imported where a model is built, not with this module: its import takes ~5 s, and
the worker processes of a test module that imports this one (TP ranks) import it too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

if TYPE_CHECKING:
    from transformers import Qwen3Config
    from transformers import Qwen3ForCausalLM as HFQwen3ForCausalLM


def tiny_hf_config(tie: bool = False, vocab_size: int = 256, num_layers: int = 2,
                   rope_parameters: dict | None = None) -> Qwen3Config:
    from transformers import Qwen3Config

    # GQA 4:2 and head_dim 32 != hidden / heads (16), as in the real Qwen3 family.
    rope = {"rope_parameters": {"rope_theta": 10000.0, **rope_parameters}} if rope_parameters else \
        {"rope_theta": 10000.0}
    return Qwen3Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
        tie_word_embeddings=tie, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, **rope,
    )


def build_tiny_checkpoint(directory: Path, tie: bool = False, seed: int = 0, vocab_size: int = 256,
                          num_layers: int = 2, rope_parameters: dict | None = None) -> HFQwen3ForCausalLM:
    """Save a random tiny Qwen3 (every weight random, norms too) and return the HF model, float32.
    `rope_parameters`: RoPE scaling (transformers 5's form: {"rope_type": "yarn", "factor": ...})."""
    from transformers import Qwen3ForCausalLM as HFQwen3ForCausalLM

    torch.manual_seed(seed)
    model = HFQwen3ForCausalLM(tiny_hf_config(tie, vocab_size, num_layers, rope_parameters)).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.copy_(0.15 * torch.randn_like(param))
    model.save_pretrained(directory)
    return model


# --- fine-grained FP8 (Hugging Face's format, as Qwen3-14B-FP8 stores it) -------------------------

FP8_BLOCK = 128
FP8_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny_fp8_hf_config(num_layers: int = 2, vocab_size: int = 512) -> Qwen3Config:
    """Every linear dimension a multiple of 128, so the 128 x 128 blocks are real, and every TP=2 shard
    too: q 512 rows, k and v 256 (two KV heads of 128), gate/up/down 512, hidden 256."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size, hidden_size=256, intermediate_size=512, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128, max_position_embeddings=1024,
        tie_word_embeddings=False, rope_theta=10000.0, rms_norm_eps=1e-6, bos_token_id=None,
        eos_token_id=None, torch_dtype="bfloat16",
    )


def fp8_quantize_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The format by its definition, block by block: scale = amax / 448, fp8 = round(w / scale)."""
    rows, cols = weight.shape
    quantized = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    scale_inv = torch.empty(-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK), dtype=torch.float32)
    for i in range(scale_inv.shape[0]):
        for j in range(scale_inv.shape[1]):
            block = weight[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK].float()
            scale = block.abs().max().clamp(min=1e-10) / 448.0
            scale_inv[i, j] = scale
            quantized[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK] = (
                (block / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn))
    return quantized, scale_inv


def fp8_dequantize_blocks(quantized: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    scales = scale_inv.repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)
    return quantized.float() * scales[: quantized.shape[0], : quantized.shape[1]]


def _is_fp8_linear(name: str, modules_to_not_convert: tuple[str, ...]) -> bool:
    module = name.removesuffix(".weight")
    return (name.endswith(".weight") and module.rsplit(".", 1)[-1] in FP8_LINEARS
            and not any(module == m or module.startswith(m + ".") for m in modules_to_not_convert))


def build_tiny_fp8_checkpoints(directory: Path, seed: int = 0, num_layers: int = 2,
                               modules_to_not_convert: tuple[str, ...] = ()) -> dict[str, Path]:
    """One random tiny Qwen3 (tiny_fp8_hf_config) saved three ways under `directory`:

    * "bf16": every tensor in bfloat16, an ordinary checkpoint (for --quantization fp8);
    * "fp8": the same weights as a fine-grained FP8 checkpoint: each linear weight (but those of
      `modules_to_not_convert`) as float8_e4m3fn + float32 weight_scale_inv, the rest in bfloat16,
      and the quantization_config Qwen publishes;
    * "dequantized": the fp8 checkpoint's linear weights multiplied out to float32, no
      quantization_config: the model the fp8 checkpoint stands for.
    """
    from transformers import Qwen3ForCausalLM as HFQwen3ForCausalLM

    torch.manual_seed(seed)
    model = HFQwen3ForCausalLM(tiny_fp8_hf_config(num_layers)).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.copy_(0.1 * torch.randn_like(param))
        model.to(torch.bfloat16)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    fp8, dequantized = {}, {}
    for name, tensor in state.items():
        if _is_fp8_linear(name, modules_to_not_convert):
            quantized, scale_inv = fp8_quantize_blocks(tensor)
            fp8[name], fp8[name.removesuffix("weight") + "weight_scale_inv"] = quantized, scale_inv
            dequantized[name] = fp8_dequantize_blocks(quantized, scale_inv)
        else:
            fp8[name] = dequantized[name] = tensor
    paths = {}
    for kind, tensors in (("bf16", state), ("fp8", fp8), ("dequantized", dequantized)):
        paths[kind] = path = Path(directory) / kind
        model.save_pretrained(path)
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
        if kind == "fp8":
            config = json.loads((path / "config.json").read_text())
            config["quantization_config"] = {
                "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
            }
            if modules_to_not_convert:
                config["quantization_config"]["modules_to_not_convert"] = list(modules_to_not_convert)
            (path / "config.json").write_text(json.dumps(config, indent=2))
    return paths
