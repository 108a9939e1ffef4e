"""YaRN's rotary frequencies and attention factor (core/rope_scaling.py reads the config).

YaRN ("Yet another RoPE extensioN") leaves the fast-turning dimensions of RoPE as trained
(extrapolation), divides the slow ones' frequencies by `factor` (interpolation), and blends the two
over a ramp between the dimensions that turn `beta_fast` and `beta_slow` times within the original
context. The rotary tables are then multiplied by an attention factor (0.1 ln(factor) + 1 by
default), which scales q.k by its square. The arithmetic follows the YaRN paper and transformers'
`_compute_yarn_parameters`, with which tests/test_rope_scaling.py checks it to the last bit.
"""

from __future__ import annotations

import math

import torch

from core.rope_scaling import YarnScaling


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(scaling: YarnScaling) -> float:
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    if scaling.mscale and scaling.mscale_all_dim:
        return (_yarn_mscale(scaling.factor, scaling.mscale)
                / _yarn_mscale(scaling.factor, scaling.mscale_all_dim))
    return _yarn_mscale(scaling.factor)


def _correction_dim(num_rotations: float, dim: int, base: float, max_positions: int) -> float:
    """The dimension whose frequency turns `num_rotations` times over `max_positions` tokens."""
    return (dim * math.log(max_positions / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_inv_freq(head_dim: int, theta: float, scaling: YarnScaling) -> torch.Tensor:
    """[head_dim / 2] float32 inverse frequencies, blended between extrapolation and interpolation."""
    pos_freqs = theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (scaling.factor * pos_freqs)
    low = _correction_dim(scaling.beta_fast, head_dim, theta, scaling.original_max_position_embeddings)
    high = _correction_dim(scaling.beta_slow, head_dim, theta, scaling.original_max_position_embeddings)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # no division by zero
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_share = 1 - ramp
    return interpolation * (1 - extrapolation_share) + extrapolation * extrapolation_share
