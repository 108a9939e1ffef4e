"""QuantizedInput: a linear layer's input already quantized to FP8 by the kernel that computed it.

A block-scaled FP8 layer multiplies activations quantized per token and group of 128 columns
(core/execution/model/fp8_kernels.py). Where the kernel before it holds each group whole in
registers as it writes its output, it can write the quantized values and scales itself, and the
separate pass (a read of the bf16 output, a write of the FP8 one, a kernel) goes. The attention
kernels (extend, decode split and reduce) do so for o_proj: a head is 128 columns, one group. The
layer's method allocates the buffers in the layout its GEMM reads (`LinearMethod.quantized_input`)
and multiplies them (`LinearMethod.apply_quantized`); the values are those the separate pass
computes, bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from core.execution.model.fp8_format import BLOCK

ACTIVATION_GROUP = BLOCK  # the columns one activation scale covers


class QuantizedInput(NamedTuple):
    values: torch.Tensor  # float8_e4m3fn [R, K], R >= num_tokens; rows past num_tokens are padding (zeros
    # in eager steps, unwritten in a CUDA graph: their products are dropped)
    scales: torch.Tensor  # float32 [R, K / 128], strided as the layer's GEMM reads them
    num_tokens: int  # the rows the producer writes: 0 .. num_tokens - 1


def quantized_output_args(q: torch.Tensor, out: torch.Tensor | None, quantize_into: QuantizedInput | None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An attention kernel's (out, values, scales) arguments: the buffers it writes, and stand-ins
    (q, of out's dtype) for those it does not."""
    if quantize_into is None:
        assert out is not None
        return out, q, q
    values, scales = quantize_into.values, quantize_into.scales
    heads, head_dim = q.shape[1], q.shape[2]
    assert head_dim == ACTIVATION_GROUP and values.shape[1] == heads * head_dim and values.stride(1) == 1, \
        f"{heads} heads of {head_dim} cannot fill a quantized input of {tuple(values.shape)}"
    return q, values, scales
