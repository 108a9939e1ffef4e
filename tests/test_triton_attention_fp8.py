"""An fp8 KV cache (core/execution/kv_cache.py) through the Triton kernels: the write kernel stores what
`to_cache_dtype` stores (saturated at +-448, rounded to nearest), and decode and extend attention
over fp8 pages give ReferenceAttention's output over the same pages (both widen each K/V row to
the query's dtype). On the CPU through the Triton interpreter, float32 queries; see
tests/test_triton_attention.py for how the interpreter is switched on.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from test_triton_attention import HEAD_DIM, Step, build_step  # noqa: E402
from triton_interpreter import is_interpreted, run_in_fresh_interpreter, skip_unless_interpreted  # noqa: E402

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]')")

from core.execution.attention.backend import write_kv  # noqa: E402
from core.execution.attention.reference import ReferenceAttention  # noqa: E402
from core.execution.attention.triton_backend import TritonAttention  # noqa: E402
from core.execution.attention.triton_decode import _decode_split_kernel  # noqa: E402
from core.execution.attention.triton_kv_write import write_kv_paged  # noqa: E402
from core.execution.kv_cache import FP8_KV_DTYPE, FP8_KV_MAX, to_cache_dtype  # noqa: E402

INTERPRETED = is_interpreted(triton.language.zeros, _decode_split_kernel)


@pytest.fixture(autouse=True)
def _kernels_run_here_or_in_the_child(request):
    skip_unless_interpreted(request, INTERPRETED)


def test_kernels_in_a_fresh_interpreter():
    run_in_fresh_interpreter(__file__, INTERPRETED)


def as_fp8_step(step: Step) -> Step:
    """The step over fp8 caches holding its prefix as the cache stores it (NaN stays NaN: unwritten)."""
    return Step(step.q, step.k, step.v, to_cache_dtype(step.k_cache, FP8_KV_DTYPE),
                to_cache_dtype(step.v_cache, FP8_KV_DTYPE), step.meta)


def assert_same_values(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal values (an underflow's zero may keep its sign in torch and not in the kernel)."""
    torch.testing.assert_close(got.float(), expected.float(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("block_size", [1, 16])
def test_the_write_kernel_stores_what_to_cache_dtype_stores(block_size):
    generator = torch.Generator().manual_seed(block_size)
    num_pages, kv_heads, num_tokens = 5, 2, 2 * block_size + 3
    k = 150.0 * torch.randn(num_tokens, kv_heads, HEAD_DIM, generator=generator)  # some beyond 448
    v = torch.randn(num_tokens, kv_heads, HEAD_DIM, generator=generator) * torch.logspace(-3, 2, HEAD_DIM)
    k[0, 0, :4] = torch.tensor([124.75, -1000.0, 448.0, float("inf")])  # a carry into the exponent
    slots = torch.randperm(num_pages * block_size, generator=generator)[:num_tokens]
    caches = [torch.zeros(num_pages, block_size, kv_heads, HEAD_DIM, dtype=FP8_KV_DTYPE) for _ in range(4)]
    write_kv(k, v, caches[0], caches[1], slots)
    write_kv_paged(k, v, caches[2], caches[3], slots)
    assert_same_values(caches[2], caches[0])
    assert_same_values(caches[3], caches[1])
    written = caches[0].view(-1, kv_heads, HEAD_DIM)[slots[0], 0, :4].float()
    assert written.tolist() == [128.0, -FP8_KV_MAX, FP8_KV_MAX, FP8_KV_MAX]


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_attention_over_fp8_pages_equals_the_reference_over_them(block_size):
    """Fresh prefills, chunks over a cached prefix, decodes, one token, no query, in one step."""
    requests = [(0, 37), (45, 20), (block_size - 1, block_size + 1), (16, 1), (0, 1), (20, 0), (70, 1)]
    step = as_fp8_step(build_step(requests, block_size, 6, 2, torch.float32, seed=block_size))
    k_ref, v_ref = step.k_cache.clone(), step.v_cache.clone()
    expected = ReferenceAttention().forward(step.q, step.k, step.v, k_ref, v_ref, step.meta, HEAD_DIM**-0.5)
    k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
    out = TritonAttention("cpu").forward(step.q, step.k, step.v, k_cache, v_cache, step.meta, HEAD_DIM**-0.5)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, rtol=2e-5, atol=2e-5)
    assert_same_values(k_cache, k_ref)
    assert_same_values(v_cache, v_ref)


def test_fp8_pages_cost_attention_only_their_rounding():
    """Against the same step over float32 pages: e4m3 keeps 3 mantissa bits (<= 6.25 % a value), and
    the attention output moves by a few percent of its range, not more."""
    step = build_step([(40, 8), (70, 1)], 16, 4, 2, torch.float32, seed=3)
    exact = ReferenceAttention().forward(step.q, step.k, step.v, step.k_cache.clone(), step.v_cache.clone(),
                                         step.meta, HEAD_DIM**-0.5)
    fp8 = as_fp8_step(step)
    out = TritonAttention("cpu").forward(fp8.q, fp8.k, fp8.v, fp8.k_cache.clone(), fp8.v_cache.clone(),
                                         fp8.meta, HEAD_DIM**-0.5)
    relative = float((out - exact).abs().max() / exact.abs().max())
    assert 1e-4 < relative < 0.1, relative
