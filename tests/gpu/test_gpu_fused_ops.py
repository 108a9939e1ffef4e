"""The fused Triton kernels on a CUDA GPU, in bfloat16 at Qwen3-14B's shapes, against the torch ops.

Run on the GPU machine: python -m pytest tests/gpu/test_gpu_fused_ops.py -v

The kernels compute in float32 where torch does and round where torch rounds, so their float32
intermediates differ from torch's only in the last bits (sum order, rsqrt, exp). Now and then that
moves a rounding to bfloat16 by one step; carried through the weight product, that is at most 2
bfloat16 ulps of the output. RoPE mixes two values of a head, so its error is measured in ulps of the
rotated pair's magnitude (which the rotation keeps), not of an output that may have cancelled to ~0.
The residual sum is one correctly rounded add: bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from core.execution.model.fused import add_rms_norm, qk_norm_rope, rms_norm, silu_mul
from core.execution.model.layers import RotaryEmbedding

HIDDEN, Q_HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 5120, 40, 8, 128, 17408
MAX_POSITIONS, EPS = 40960, 1e-6
MAX_ULPS = 2


def random(*shape: int, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return (scale * torch.randn(*shape, generator=generator, device="cuda")).to(torch.bfloat16)


def norm_weight(size: int, seed: int) -> torch.Tensor:
    return 1.0 + random(size, scale=0.2, seed=seed)


def bf16_ulp(magnitude: torch.Tensor) -> torch.Tensor:
    """The bfloat16 spacing at |magnitude|: 8 significant bits."""
    _, exponent = torch.frexp(magnitude.float())
    return torch.ldexp(torch.ones_like(magnitude, dtype=torch.float32), exponent - 8)


def assert_within_ulps(got: torch.Tensor, expected: torch.Tensor, magnitude: torch.Tensor | None = None,
                       what: str = "") -> None:
    assert got.dtype == expected.dtype == torch.bfloat16 and got.shape == expected.shape
    if magnitude is None:
        magnitude = torch.maximum(got.float().abs(), expected.float().abs())
    ulps = ((got.float() - expected.float()).abs() / bf16_ulp(magnitude)).max().item()
    assert ulps <= MAX_ULPS, f"{what}: {ulps} bfloat16 ulps from torch"


def rope_tables() -> tuple[torch.Tensor, torch.Tensor]:
    rope = RotaryEmbedding(HEAD_DIM, MAX_POSITIONS, theta=1e6).to("cuda")
    return rope.cos, rope.sin


@pytest.mark.parametrize("num_tokens", [1, 256, 4096])
def test_add_rms_norm_and_rms_norm_match_torch(num_tokens):
    x = random(num_tokens, HIDDEN, seed=num_tokens)
    residual = random(num_tokens, HIDDEN, scale=8.0, seed=num_tokens + 1)
    weight = norm_weight(HIDDEN, seed=2)

    normed, new_residual = add_rms_norm(x, residual, weight, EPS)
    expected_normed, expected_residual = add_rms_norm(x, residual, weight, EPS, use_triton=False)
    assert torch.equal(new_residual, expected_residual)
    assert_within_ulps(normed, expected_normed, what="add_rms_norm")
    assert_within_ulps(rms_norm(x, weight, EPS), rms_norm(x, weight, EPS, use_triton=False), what="rms_norm")


@pytest.mark.parametrize("num_tokens", [1, 256, 4096])
def test_qk_norm_rope_matches_torch_on_split_views(num_tokens):
    q_size, kv_size = Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    qkv = random(num_tokens, q_size + 2 * kv_size, scale=3.0, seed=num_tokens)
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q, k = q.reshape(num_tokens, Q_HEADS, HEAD_DIM), k.reshape(num_tokens, KV_HEADS, HEAD_DIM)
    q_weight, k_weight = norm_weight(HEAD_DIM, seed=1), norm_weight(HEAD_DIM, seed=2)
    cos, sin = rope_tables()
    generator = torch.Generator(device="cuda").manual_seed(num_tokens)
    positions = torch.randint(0, MAX_POSITIONS, (num_tokens,), generator=generator, device="cuda")

    got = qk_norm_rope(q, k, q_weight, k_weight, cos, sin, positions, EPS)
    expected = qk_norm_rope(q, k, q_weight, k_weight, cos, sin, positions, EPS, use_triton=False)

    for name, got_x, expected_x in zip("qk", got, expected):
        first, second = expected_x.float().chunk(2, dim=-1)
        pair_magnitude = torch.sqrt(first**2 + second**2).repeat(1, 1, 2)
        assert_within_ulps(got_x, expected_x, pair_magnitude, what=name)


@pytest.mark.parametrize("num_tokens", [1, 256, 4096])
def test_silu_mul_matches_torch(num_tokens):
    gate_up = random(num_tokens, 2 * INTERMEDIATE, scale=3.0, seed=num_tokens)
    assert_within_ulps(silu_mul(gate_up), silu_mul(gate_up, use_triton=False), what="silu_mul")


def test_kernels_replay_in_a_cuda_graph():
    """Captured once, the launches read whatever the static inputs hold at replay."""
    num_tokens = 8
    x, residual = random(num_tokens, HIDDEN, seed=1), random(num_tokens, HIDDEN, seed=2)
    gate_up = random(num_tokens, 2 * INTERMEDIATE, seed=3)
    qkv = random(num_tokens, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, seed=4)
    positions = torch.arange(num_tokens, device="cuda")
    weight, head_weight = norm_weight(HIDDEN, seed=5), norm_weight(HEAD_DIM, seed=6)
    cos, sin = rope_tables()

    def step() -> list[torch.Tensor]:
        q, k, _ = qkv.split([Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        q, k = q.reshape(num_tokens, Q_HEADS, HEAD_DIM), k.reshape(num_tokens, KV_HEADS, HEAD_DIM)
        return [*add_rms_norm(x, residual, weight, EPS), rms_norm(x, weight, EPS), silu_mul(gate_up),
                *qk_norm_rope(q, k, head_weight, head_weight, cos, sin, positions, EPS)]

    step()  # compiles the kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for i, tensor in enumerate((x, residual, gate_up, qkv)):
        tensor.copy_(random(*tensor.shape, seed=10 + i))
    positions.copy_(torch.arange(100, 100 + num_tokens, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    for replayed, eager in zip(captured, step()):
        assert torch.equal(replayed, eager)
