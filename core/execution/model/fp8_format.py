"""The block-scaled FP8 format in plain torch: quantize and dequantize weights (128 x 128 blocks) and
activations (1 x 128 groups per token), and the reference matmul.

A weight [N, K] is stored as float8_e4m3fn `weight` [N, K] and float32 `weight_scale_inv`
[ceil(N / 128), ceil(K / 128)]; block (i, j) holds `weight * weight_scale_inv[i, j]`. Quantizing a
block: scale = amax / 448 (448 is e4m3's largest finite value), fp8 = round-to-nearest-even(w /
scale), so every block uses the whole e4m3 range. Activations are quantized the same way per token
and group of 128 columns. The CPU serves FP8 layers through `dequantize_weight` (fp8_linear.py);
the Triton kernels (fp8_kernels.py) are tested against `reference_matmul`.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = 128
# A block or group of zeros gets this amax, so its scale is positive and its values stay zero.
MIN_AMAX = 1e-10


def _blocks(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """x [N, K] zero-padded to whole blocks and viewed as [N / rows, rows, K / cols, cols], float32."""
    n, k = x.shape
    padded = torch.nn.functional.pad(x.float(), (0, -k % cols, 0, -n % rows))
    return padded.view(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] in any float dtype -> (fp8 [N, K], weight_scale_inv [ceil(N/128), ceil(K/128)])."""
    n, k = weight.shape
    blocks = _blocks(weight, BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp(min=MIN_AMAX) / FP8_MAX
    quantized = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    quantized = quantized.view(blocks.shape[0] * BLOCK, blocks.shape[2] * BLOCK)[:n, :k].contiguous()
    return quantized, scale[:, 0, :, 0].contiguous()


def dequantize_weight(weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """fp8 [N, K] and its block scales -> float32 [N, K]."""
    n, k = weight.shape
    scales = scale_inv.repeat_interleave(BLOCK, dim=0)[:n].repeat_interleave(BLOCK, dim=1)[:, :k]
    return weight.float() * scales


def quantize_activations_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 [M, K], scales [M, ceil(K/128)]): one scale per token and 128 columns, computed
    in float32 whatever x's dtype (as the kernels do: a bf16 scale and division would round twice)."""
    m, k = x.shape
    groups = _blocks(x.float(), 1, BLOCK)  # [M, 1, G, 128]
    amax = groups.abs().amax(dim=3, keepdim=True).clamp(min=MIN_AMAX)
    # A tensor divisor: CUDA torch multiplies by the reciprocal of a scalar one, which is not IEEE division.
    scale = amax / torch.full_like(amax, FP8_MAX)
    quantized = (groups / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return quantized.view(m, -1)[:, :k].contiguous(), scale[:, 0, :, 0].contiguous()


def dequantize_activations(x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp8 [M, K] and its group scales -> float32 [M, K]."""
    return x.float() * scales.repeat_interleave(BLOCK, dim=1)[:, : x.shape[1]]


def reference_matmul(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor,
                     quantize_activations: bool = True) -> torch.Tensor:
    """x [M, K] times the dequantized weight [N, K] transposed, in float32 -> [M, N] in x's dtype.
    With `quantize_activations` x first goes through the 1 x 128 group quantization, as the FP8 GEMMs
    do; without, this is the weight-only product the CPU serves."""
    if quantize_activations:
        activations = dequantize_activations(*quantize_activations_reference(x))
    else:
        activations = x.float()
    return (activations @ dequantize_weight(weight, scale_inv).t()).to(x.dtype)
