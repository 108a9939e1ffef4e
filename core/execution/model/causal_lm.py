"""CausalLM: what the runner and the loader need of a model, whatever its architecture.

A model is registered under its checkpoint's `model_type` in core/registry.py MODEL_TYPES and built
by `core.execution.runner.build_model` as `cls(config, tp)`, on the target device and under the
model's dtype; the loader then fills every parameter named by `checkpoint_slices` (from the
safetensors files, or with dummy weights) and nothing else. Its linear layers take the method
`linear_method_for(config)` returns, so that a quantized checkpoint needs no change to the model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from core.config import ModelConfig
from core.execution.attention.backend import AttentionBackend, AttentionMetadata
from core.execution.distributed import TPGroup
from core.execution.kv_cache import KVCache
from core.execution.model.checkpoint_slice import SliceMap


class CausalLM(nn.Module, ABC):
    """A decoder over the paged KV cache, split over the ranks of `tp`."""

    def __init__(self, config: ModelConfig, tp: TPGroup) -> None:
        super().__init__()
        self.config = config
        self.tp = tp

    @abstractmethod
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache,
                backend: AttentionBackend, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states of every token of the step: [T, hidden]. Writes the step's K/V into
        kv_cache through `backend`; launches depend on shapes only when meta.static_shapes is set."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Full-vocabulary float32 logits [N, vocab] of the given rows on TP rank 0; None on the others."""

    @abstractmethod
    def checkpoint_slices(self) -> SliceMap:
        """Every checkpoint tensor this rank reads: name -> (parameter name, slice)."""
