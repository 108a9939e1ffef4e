"""Qwen3 (dense) in plain torch, tensor-parallel, over a paged KV cache.

The modules mirror the Hugging Face checkpoint (`Qwen3Attention`, `Qwen3MLP`, ...), so every
checkpoint tensor maps to one parameter slice (`checkpoint_slices`). q/k/v and gate/up are packed
into one column-parallel matmul each; o_proj and down_proj are row-parallel and all-reduce. The
elementwise work between the matmuls runs as fused kernels (core/execution/model/fused.py); for that the
residual stream travels beside each layer's output, as in vLLM, and the next norm adds it. The
linear layers hold and multiply their weights through the checkpoint format's LinearMethod; they are
built with their checkpoint names (`prefix`), so a format may treat some of them differently.
"""

from __future__ import annotations

import torch
from torch import nn

from core.config import ModelConfig
from core.execution.attention.backend import AttentionBackend, AttentionMetadata
from core.execution.distributed import TPGroup
from core.execution.kv_cache import KVCache
from core.execution.model.causal_lm import CausalLM
from core.execution.model.checkpoint_slice import SliceMap
from core.execution.model.fused import qk_norm_rope
from core.execution.model.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from core.execution.model.linear_method import LinearMethod, linear_method_for


def _prefixed(module_prefix: str, slices: SliceMap) -> SliceMap:
    return {ckpt: (f"{module_prefix}.{param}", spec) for ckpt, (param, spec) in slices.items()}


class Qwen3Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int, tp: TPGroup, linear: LinearMethod,
                 prefix: str) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = config.num_heads // tp.size
        self.num_kv_heads = config.num_kv_heads // tp.size
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_proj = ColumnParallelLinear(
            config.hidden_size, [config.q_size, config.kv_size, config.kv_size],
            ["q_proj", "k_proj", "v_proj"], tp, linear, prefix,
        )
        self.o_proj = RowParallelLinear(config.q_size, config.hidden_size, tp, linear, f"{prefix}.o_proj")
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding,
                kv_cache: KVCache, backend: AttentionBackend, meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # [T, heads, head_dim]; Qwen3 normalises q and k per head before RoPE.
        q, k = qk_norm_rope(q.reshape(num_tokens, self.num_heads, self.head_dim),
                            k.reshape(num_tokens, self.num_kv_heads, self.head_dim),
                            self.q_norm.weight, self.k_norm.weight, rope.cos, rope.sin, positions,
                            self.q_norm.eps)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache.layer(self.layer_index)
        out = backend.forward(q, k, v, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.q_size))

    def checkpoint_slices(self, prefix: str) -> SliceMap:
        return {
            **_prefixed("qkv_proj", self.qkv_proj.checkpoint_slices()),
            **_prefixed("o_proj", self.o_proj.checkpoint_slices()),
            **_prefixed("q_norm", self.q_norm.checkpoint_slices(f"{prefix}.q_norm")),
            **_prefixed("k_norm", self.k_norm.checkpoint_slices(f"{prefix}.k_norm")),
        }


class Qwen3MLP(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPGroup, linear: LinearMethod, prefix: str) -> None:
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, ["gate_proj", "up_proj"], tp, linear, prefix
        )
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, tp, linear,
                                           f"{prefix}.down_proj")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward_gated(self.gate_up_proj(x))

    def checkpoint_slices(self) -> SliceMap:
        return {
            **_prefixed("gate_up_proj", self.gate_up_proj.checkpoint_slices()),
            **_prefixed("down_proj", self.down_proj.checkpoint_slices()),
        }


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int, tp: TPGroup, linear: LinearMethod,
                 prefix: str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Qwen3Attention(config, layer_index, tp, linear, f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = Qwen3MLP(config, tp, linear, f"{prefix}.mlp")

    def forward(self, hidden, residual, positions, rope, kv_cache, backend, meta
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) -> (mlp output, residual stream before it); their sum is the layer's
        output. The first layer gets residual None: its input is the embedding."""
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, positions, rope, kv_cache, backend, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual

    def checkpoint_slices(self, prefix: str) -> SliceMap:
        return {
            **_prefixed("input_layernorm",
                        self.input_layernorm.checkpoint_slices(f"{prefix}.input_layernorm")),
            **_prefixed("self_attn", self.self_attn.checkpoint_slices(f"{prefix}.self_attn")),
            **_prefixed("post_attention_layernorm",
                        self.post_attention_layernorm.checkpoint_slices(f"{prefix}.post_attention_layernorm")),
            **_prefixed("mlp", self.mlp.checkpoint_slices()),
        }


class Qwen3Model(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPGroup, linear: LinearMethod, prefix: str) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(config, i, tp, linear, f"{prefix}.layers.{i}")
                                    for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rope = RotaryEmbedding(config.head_dim, config.max_positions, config.rope_theta,
                                    config.rope_scaling)

    def forward(self, input_ids, positions, kv_cache, backend, meta) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None  # [T, hidden]
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, positions, self.rope, kv_cache, backend, meta)
        hidden, _ = self.norm(hidden, residual)  # num_layers > 0 (ModelConfig checks): a residual
        return hidden

    def checkpoint_slices(self, prefix: str) -> SliceMap:
        slices = {
            **_prefixed("embed_tokens", self.embed_tokens.checkpoint_slices(f"{prefix}.embed_tokens")),
            **_prefixed("norm", self.norm.checkpoint_slices(f"{prefix}.norm")),
        }
        for i, layer in enumerate(self.layers):
            slices.update(_prefixed(f"layers.{i}", layer.checkpoint_slices(f"{prefix}.layers.{i}")))
        return slices


class Qwen3ForCausalLM(CausalLM):
    def __init__(self, config: ModelConfig, tp: TPGroup) -> None:
        super().__init__(config, tp)
        self.model = Qwen3Model(config, tp, linear_method_for(config), "model")
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache,
                backend: AttentionBackend, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states of every token of the step: [T, hidden]."""
        return self.model(input_ids, positions, kv_cache, backend, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Full-vocabulary float32 logits of the given rows on TP rank 0; None on the others."""
        logits = self.lm_head.logits(hidden)
        return None if logits is None else logits.float()

    def checkpoint_slices(self) -> SliceMap:
        """Every checkpoint tensor this rank reads: name -> (parameter name, slice)."""
        slices = _prefixed("model", self.model.checkpoint_slices("model"))
        if not self.config.tie_word_embeddings:
            slices.update(_prefixed("lm_head", self.lm_head.checkpoint_slices("lm_head")))
        return slices
