"""Tiny Qwen3 checkpoints built with transformers and saved as real safetensors directories."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen3Config
from transformers import Qwen3ForCausalLM as HFQwen3ForCausalLM


def tiny_hf_config(tie: bool = False, vocab_size: int = 256, num_layers: int = 2) -> Qwen3Config:
    # GQA 4:2 and head_dim 32 != hidden / heads (16), as in the real Qwen3 family.
    return Qwen3Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
        tie_word_embeddings=tie, rope_theta=10000.0, rms_norm_eps=1e-6,
        bos_token_id=None, eos_token_id=None,
    )


def build_tiny_checkpoint(directory: Path, tie: bool = False, seed: int = 0, vocab_size: int = 256,
                          num_layers: int = 2) -> HFQwen3ForCausalLM:
    """Save a random tiny Qwen3 (every weight random, norms too) and return the HF model, float32."""
    torch.manual_seed(seed)
    model = HFQwen3ForCausalLM(tiny_hf_config(tie, vocab_size, num_layers)).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.copy_(0.15 * torch.randn_like(param))
    model.save_pretrained(directory)
    return model
