"""Fp8LinearMethod: linear weights in float8_e4m3fn with one float32 scale per 128 x 128 block, as
Hugging Face's fine-grained FP8 checkpoints store them (Qwen3-14B-FP8), multiplied with activations
quantized per token and 128 columns at run time.

Each layer holds `weight` fp8 [rows, in_features] and `weight_scale_inv` float32
[ceil(rows / 128), ceil(in_features / 128)]; a checkpoint matrix `name` fills them from
`name.weight` and `name.weight_scale_inv`, the scale's slice being the weight's divided by 128.
So a tensor-parallel shard, and every matrix of a packed layer (q, k, v; gate, up), must start and
end on a multiple of 128: `checkpoint_slices` refuses one that does not, naming the matrix.
With `--quantization fp8` (or dummy weights) the checkpoint holds the weights in a float dtype:
each rank loads its shard in the model's dtype and quantizes it after loading, block by block of
the full matrix, so the result equals what a quantized checkpoint of the same weights would load.
Modules the checkpoint's `modules_to_not_convert` names stay in the model's dtype
(UnquantizedLinearMethod). The matmul is the GEMM `fp8_gemm.choose_gemm` picks for the device.
"""

from __future__ import annotations

import torch
from torch import nn

from core.config import ModelConfig
from core.execution.model.checkpoint_slice import CheckpointSlice, SliceMap
from core.execution.model.fp8_format import BLOCK, FP8_DTYPE, quantize_weight
from core.execution.model.fp8_gemm import GATED_GEMMS, choose_gemm
from core.execution.model.linear_method import LinearMethod
from core.execution.model.unquantized_linear import UnquantizedLinearMethod


class Fp8LinearMethod(LinearMethod):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.format = config.quantization_config
        # Dummy weights are drawn as a float checkpoint would hold them, then quantized like one.
        self.quantize_at_load = config.weights_are_dummy or not self.format.checkpoint_is_quantized
        self.unquantized = UnquantizedLinearMethod(config)
        self.gemm = choose_gemm(torch.get_default_device())

    def method_for(self, matrices: list[str]) -> LinearMethod:
        skipped = [name for name in matrices if self.format.leaves_unconverted(name)]
        if not skipped:
            return self
        if len(skipped) == len(matrices):
            return self.unquantized
        raise ValueError(f"modules_to_not_convert leaves {', '.join(skipped)} unquantized but not "
                         f"{', '.join(m for m in matrices if m not in skipped)}, which Cadence packs into "
                         "one layer with it: name all of them or none")

    def create_weights(self, layer: nn.Module, in_features: int, out_sizes: list[int]) -> None:
        rows = sum(out_sizes)
        if self.quantize_at_load:  # the model's dtype until process_weights_after_loading
            layer.weight = nn.Parameter(torch.empty(rows, in_features), requires_grad=False)
            return
        layer.weight = nn.Parameter(torch.empty(rows, in_features, dtype=FP8_DTYPE), requires_grad=False)
        layer.weight_scale_inv = nn.Parameter(
            torch.empty(_cdiv(rows, BLOCK), _cdiv(in_features, BLOCK), dtype=torch.float32),
            requires_grad=False)

    def checkpoint_slices(self, matrices: dict[str, CheckpointSlice]) -> SliceMap:
        slices: SliceMap = {}
        for name, spec in matrices.items():
            _check_on_blocks(name, spec)
            slices[f"{name}.weight"] = ("weight", spec)
            if not self.quantize_at_load:
                slices[f"{name}.weight_scale_inv"] = ("weight_scale_inv", scale_slice(spec))
        return slices

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.quantize_at_load:
            weight, scale_inv = quantize_weight(layer.weight.data)
            layer.weight = nn.Parameter(weight, requires_grad=False)
            layer.weight_scale_inv = nn.Parameter(scale_inv, requires_grad=False)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return self.gemm(x, layer.weight, layer.weight_scale_inv)

    def apply_gated(self, layer: nn.Module, gate_up: torch.Tensor) -> torch.Tensor:
        if self.gemm in GATED_GEMMS:  # SiLU * up computed where the activations are quantized
            return GATED_GEMMS[self.gemm](gate_up, layer.weight, layer.weight_scale_inv)
        return super().apply_gated(layer, gate_up)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def scale_slice(weight: CheckpointSlice) -> CheckpointSlice:
    """The slice of `weight_scale_inv` that goes with a slice of its weight (on 128-multiples)."""
    full = tuple(_cdiv(size, BLOCK) for size in weight.full_shape)
    if weight.length is None:
        return CheckpointSlice(full)
    end = _cdiv(weight.start + weight.length, BLOCK)
    start = weight.start // BLOCK
    return CheckpointSlice(full, dim=weight.dim, start=start, length=end - start,
                           dest_offset=weight.dest_offset // BLOCK)


def _check_on_blocks(name: str, spec: CheckpointSlice) -> None:
    if spec.length is None:
        return
    size, end = spec.full_shape[spec.dim], spec.start + spec.length
    what = "rows" if spec.dim == 0 else "columns"
    if spec.start % BLOCK or (end % BLOCK and end != size) or spec.dest_offset % BLOCK:
        raise ValueError(
            f"{name}: this rank holds {what} {spec.start}..{end} of {size}, placed at {spec.dest_offset} in "
            f"its layer, which do not fall on the {BLOCK} x {BLOCK} blocks of its FP8 weight_scale_inv: "
            f"every shard (and every matrix packed into one layer) must start and end on a multiple of "
            f"{BLOCK}; use a smaller tensor-parallel size")
