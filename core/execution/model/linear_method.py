"""LinearMethod: how a linear layer holds and applies its weight, the seam a quantized format fills.

ColumnParallelLinear and RowParallelLinear (layers.py) own the tensor-parallel split: which rows or
columns of each checkpoint matrix this rank holds, and the all-reduce of a row-parallel layer. Their
LinearMethod owns the rest: which parameters the layer has (an unquantized weight; a quantized
weight and its scales), which checkpoint tensors fill them and which slice of each this rank reads,
and the matmul. The model never names a method: it builds layers with `linear_method_for(config)`,
the one the checkpoint's quantization selects (core/registry.py LINEAR_METHODS). The embedding and
the LM head are not linear layers of this kind and stay in the model's dtype.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from core.config import ModelConfig
from core.execution.model.checkpoint_slice import CheckpointSlice, SliceMap
from core.execution.model.fused import silu_mul
from core.execution.registry import registered_class
from core.registry import LINEAR_METHODS


class LinearMethod(ABC):
    """One instance serves every linear layer of a model; it keeps its state on the layers.
    Constructed as `cls(config)`, on the model's device and under its default dtype."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config

    def method_for(self, matrices: list[str]) -> LinearMethod:
        """The method that serves the layer packing these checkpoint matrices (`model.layers.0.mlp.up_proj`):
        this one, unless the checkpoint leaves them in another format (FP8's modules_to_not_convert)."""
        return self

    @abstractmethod
    def create_weights(self, layer: nn.Module, in_features: int, out_sizes: list[int]) -> None:
        """Register on `layer` the parameters of this rank's weight: `in_features` columns and
        sum(out_sizes) rows, the rows of each packed checkpoint matrix in turn (q, k, v; gate, up)."""

    @abstractmethod
    def checkpoint_slices(self, matrices: dict[str, CheckpointSlice]) -> SliceMap:
        """The checkpoint tensors that fill the layer's parameters. `matrices` maps each checkpoint
        matrix's name (`model.layers.0.mlp.up_proj`, without `.weight`) to the slice of its weight this
        rank holds and where that goes in the layer's weight; the answer maps every checkpoint tensor
        to (the layer's parameter name, its slice)."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:  # noqa: B027 - most need nothing
        """Turn the loaded parameters into the ones `apply` multiplies (FP8 quantizes a weight loaded
        in the model's dtype); called once per layer after the last tensor is in."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [T, in_features] times this rank's weight transposed: [T, sum(out_sizes)]."""

    def apply_gated(self, layer: nn.Module, gate_up: torch.Tensor) -> torch.Tensor:
        """SiLU(gate) * up of gate_up [T, 2 * in_features] (gate first) times the weight: the MLP's
        down projection. A method may fold the activation into what it does to its input anyway
        (FP8 quantizes it)."""
        return self.apply(layer, silu_mul(gate_up))


def linear_method_for(config: ModelConfig) -> LinearMethod:
    """The linear method of the model's checkpoint format (its `quantization`)."""
    return registered_class(LINEAR_METHODS, config.quantization, "quantization")(config)
