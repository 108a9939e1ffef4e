"""UnquantizedLinearMethod: the weight kept and multiplied in the model's dtype, as the checkpoint has it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.execution.model.checkpoint_slice import CheckpointSlice, SliceMap
from core.execution.model.linear_method import LinearMethod


class UnquantizedLinearMethod(LinearMethod):
    """One parameter, `weight` [sum(out_sizes), in_features], filled from each matrix's `.weight`."""

    def create_weights(self, layer: nn.Module, in_features: int, out_sizes: list[int]) -> None:
        layer.weight = nn.Parameter(torch.empty(sum(out_sizes), in_features))

    def checkpoint_slices(self, matrices: dict[str, CheckpointSlice]) -> SliceMap:
        return {f"{name}.weight": ("weight", spec) for name, spec in matrices.items()}

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, layer.weight)
