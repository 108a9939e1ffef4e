"""The fused Triton kernels of core/execution/model/fused.py equal the unfused torch ops they replace.

The kernels run on the CPU through the Triton interpreter, as in tests/test_triton_attention.py: the
interpreter is only on if TRITON_INTERPRET=1 is set before triton is first imported, so run alone
this file sets it itself, and in a full test run (where an earlier module has imported triton)
`test_kernels_in_a_fresh_interpreter` runs it again in a child process. The interpreter rounds
float32 to bfloat16 toward zero (triton 3.9), so bfloat16 is checked by tests/gpu/test_gpu_fused_ops.py;
here float32 and float16. The residual sum is one rounding of an exact sum, so it must match bit
for bit; the rest may differ by the order of the float32 sum of squares and rsqrt's and exp's last
float32 bits, which can move a rounding to float16 by one step.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from triton_interpreter import is_interpreted, run_in_fresh_interpreter, skip_unless_interpreted  # noqa: E402

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]')")

from core.execution.model import fused  # noqa: E402
from core.execution.model.fused import add_rms_norm, qk_norm_rope, rms_norm, silu_mul  # noqa: E402
from core.execution.model.layers import RotaryEmbedding  # noqa: E402

# Both triton's own library and our kernels must have been built interpreted.
INTERPRETED = is_interpreted(triton.language.zeros, fused._rms_norm_kernel)


@pytest.fixture(autouse=True)
def _kernels_run_here_or_in_the_child(request):
    skip_unless_interpreted(request, INTERPRETED)


def test_kernels_in_a_fresh_interpreter():
    run_in_fresh_interpreter(__file__, INTERPRETED)


DTYPES = [torch.float32, torch.float16]
TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.float16: {"rtol": 2e-3, "atol": 2e-3}}
EPS = 1e-6


def random(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))).to(dtype)


def norm_weight(size: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Around 1 but never all ones, as in a trained checkpoint."""
    return 1.0 + random(size, dtype=dtype, seed=seed, scale=0.2)


def assert_kernel_matches(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, **TOLERANCE[expected.dtype])


# --- residual add + RMSNorm ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 37])
@pytest.mark.parametrize("size", [64, 300, 5120])
def test_add_rms_norm_kernel_equals_torch_and_its_residual_sum_is_exact(dtype, num_tokens, size):
    # The input as a column slice of a wider tensor: its rows are strided.
    x = random(num_tokens, size + 8, dtype=dtype, seed=size)[:, :size]
    residual = random(num_tokens, size, dtype=dtype, seed=size + 1, scale=4.0)
    weight = norm_weight(size, dtype, seed=size + 2)

    normed, new_residual = add_rms_norm(x, residual, weight, EPS, use_triton=True)
    expected_normed, expected_residual = add_rms_norm(x, residual, weight, EPS, use_triton=False)

    assert torch.equal(new_residual, expected_residual)
    assert_kernel_matches(normed, expected_normed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 37])
@pytest.mark.parametrize("size", [1, 300, 5120])
def test_rms_norm_kernel_equals_torch(dtype, num_tokens, size):
    x = random(num_tokens, size, dtype=dtype, seed=size, scale=3.0)
    weight = norm_weight(size, dtype, seed=size + 1)
    expected = rms_norm(x, weight, EPS, use_triton=False)
    assert_kernel_matches(rms_norm(x, weight, EPS, use_triton=True), expected)


# --- per-head q/k RMSNorm + RoPE -----------------------------------------------------------------




@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 37])
@pytest.mark.parametrize("q_heads, kv_heads, head_dim", [(5, 1, 128), (4, 2, 48), (32, 16, 64), (40, 8, 128)],
                         ids=["mqa5-d128", "gqa2-d48", "two-k-groups-d64", "qwen3-14b"])
def test_qk_norm_rope_kernel_equals_torch_on_split_views(dtype, num_tokens, q_heads, kv_heads, head_dim):
    """q and k as the model hands them over: views of one packed qkv row, not contiguous. head_dim 48
    has a half (24) that is not a power of two, so the kernel masks. A program takes a group of up to
    eight heads: one head (mqa5), two (gqa2), several k groups (32/16), five q groups and one k (14b)."""
    seed = q_heads * head_dim + num_tokens
    qkv = random(num_tokens, (q_heads + 2 * kv_heads) * head_dim, dtype=dtype, seed=seed, scale=3.0)
    q, k, _ = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q = q.reshape(num_tokens, q_heads, head_dim)
    k = k.reshape(num_tokens, kv_heads, head_dim)
    assert not q.is_contiguous() or num_tokens == 1
    q_weight, k_weight = norm_weight(head_dim, dtype, seed + 1), norm_weight(head_dim, dtype, seed + 2)
    rope = RotaryEmbedding(head_dim, max_positions=4096, theta=1e6)
    cos, sin = rope.cos, rope.sin
    positions = torch.randint(0, cos.shape[0], (num_tokens,), generator=torch.Generator().manual_seed(seed))

    got = qk_norm_rope(q, k, q_weight, k_weight, cos, sin, positions, EPS, use_triton=True)
    expected = qk_norm_rope(q, k, q_weight, k_weight, cos, sin, positions, EPS, use_triton=False)

    for got_x, expected_x in zip(got, expected):
        assert got_x.is_contiguous()
        assert_kernel_matches(got_x, expected_x)


# --- SiLU(gate) * up -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 37])
@pytest.mark.parametrize("size", [1, 96, 1500, 8704])
def test_silu_mul_kernel_equals_torch(dtype, num_tokens, size):
    """1,500 ends inside the kernel's second block of columns; 8,704 is Qwen3-14B's at TP 2."""
    gate_up = random(num_tokens, 2 * size, dtype=dtype, seed=size, scale=3.0)
    assert_kernel_matches(silu_mul(gate_up, use_triton=True), silu_mul(gate_up, use_triton=False))
