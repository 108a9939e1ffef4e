"""Activations already quantized for an FP8 product, and the layout the product wants them in.

An FP8 linear layer quantizes its input per token and 128 columns before multiplying
(`fp8_kernels.quantize_activations`): one more kernel, one more read and write of the activations.
Where a fused kernel of fused.py produces that input (the RMSNorm before q/k/v and gate/up, SiLU * up
before down), it can write the quantized values itself. It asks the layer first
(`LinearMethod.input_layout`): None where the layer takes its input unquantized, else an
`ActivationLayout`, and hands the layer a `QuantizedActivations` instead of a tensor. The values
are exactly those `quantize_activations` would compute from the kernel's unquantized output.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from core.execution.model.fp8_format import BLOCK, FP8_DTYPE, quantize_activations_reference


class ActivationLayout(NamedTuple):
    rows_multiple: int  # the quantized rows are padded to a multiple of this (cuBLAS's scaled_mm: 16)
    column_major_scales: bool  # scales with stride (1, rows), as scaled_mm wants them


class QuantizedActivations(NamedTuple):
    q: torch.Tensor  # float8_e4m3fn [R, K], R >= rows; rows from `rows` on are padding, unread
    scales: torch.Tensor  # float32 [R, ceil(K / 128)], in the layout's order
    rows: int  # the activations' rows (tokens)
    dtype: torch.dtype  # the activations' dtype before quantization: the product's output dtype


def allocate(rows: int, k: int, layout: ActivationLayout, dtype: torch.dtype, device: torch.device
             ) -> QuantizedActivations:
    """Room for `rows` x `k` activations quantized in `layout` (padding rows left unwritten: a
    product's rows are independent, and the rows it computes from them are cut off)."""
    padded = -(-rows // layout.rows_multiple) * layout.rows_multiple
    groups = -(-k // BLOCK)
    q = torch.empty((padded, k), dtype=FP8_DTYPE, device=device)
    if layout.column_major_scales:
        scales = torch.empty((groups, padded), dtype=torch.float32, device=device).t()
    else:
        scales = torch.empty((padded, groups), dtype=torch.float32, device=device)
    return QuantizedActivations(q, scales, rows, dtype)


def quantize_reference(x: torch.Tensor, layout: ActivationLayout) -> QuantizedActivations:
    """x [M, K] quantized into `layout` by the torch definition (fp8_format): what the fused
    kernels compute, for devices without them."""
    quantized = allocate(x.shape[0], x.shape[1], layout, x.dtype, x.device)
    q, scales = quantize_activations_reference(x)
    quantized.q[: x.shape[0]] = q
    quantized.scales[: x.shape[0]] = scales
    return quantized
