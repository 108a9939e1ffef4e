"""TritonAttention on a CUDA GPU: Qwen3-14B attention shapes (40 query heads, 8 KV heads, head_dim 128)
in bfloat16 against ReferenceAttention in float32, and a model's logits through TritonAttention
against the reference backend's.

Run on the GPU machine: python -m pytest tests/gpu/test_gpu_triton_attention.py -v -s
(-s prints each case's worst error). Unwritten cache slots hold NaN, so a kernel reading outside
its request's context fails loudly.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from plans import Chunk, make_plan
from torch.nn.attention import SDPBackend, sdpa_kernel

from core.config import CacheConfig, EngineConfig, ModelConfig
from core.execution.attention.backend import AttentionMetadata, write_kv
from core.execution.attention.reference import ReferenceAttention
from core.execution.runner import ModelRunner

Q_HEADS, KV_HEADS, HEAD_DIM = 40, 8, 128
SCALE = HEAD_DIM**-0.5
# Worst |triton - float32 reference| over a request's rows, relative to the reference's largest |value|.
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}


def exact_float32_sdpa(dtype: torch.dtype):
    """float32 SDPA on the math path (no fused kernel's TF32); other dtypes keep the default kernels,
    whose scores stay in float32 (the math path would round them to the input dtype)."""
    return sdpa_kernel(SDPBackend.MATH) if dtype == torch.float32 else contextlib.nullcontext()


@pytest.fixture(scope="module")
def triton_attention():
    # Imported here, not at the top: on a CPU machine tests/test_triton_attention.py must be the
    # first to import the kernels, after setting TRITON_INTERPRET=1.
    from core.execution.attention.triton_backend import TritonAttention

    return TritonAttention


@dataclass
class Step:
    q: torch.Tensor  # [T, q_heads, head_dim]
    k: torch.Tensor  # [T, kv_heads, head_dim]
    v: torch.Tensor
    k_cache: torch.Tensor  # [num_pages, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor
    meta: AttentionMetadata


def build_step(requests: list[tuple[int, int]], block_size: int, dtype: torch.dtype = torch.bfloat16,
               q_heads: int = Q_HEADS, kv_heads: int = KV_HEADS, seed: int = 0) -> Step:
    """requests: (cached_len, chunk_len); the prefix is already in randomly scattered pages."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    seq_lens = np.array([cached + chunk for cached, chunk in requests], np.int32)
    num_pages_of = [-(-int(n) // block_size) for n in seq_lens]
    num_pages = sum(num_pages_of) + 3
    order = np.random.default_rng(seed).permutation(num_pages)
    block_table = np.zeros((len(requests), max(num_pages_of)), np.int32)
    cache_shape = (num_pages, block_size, kv_heads, HEAD_DIM)
    k_cache = torch.full(cache_shape, float("nan"), dtype=dtype, device="cuda")
    v_cache = torch.full(cache_shape, float("nan"), dtype=dtype, device="cuda")
    used, slots, qs, ks, vs = 0, [], [], [], []
    for i, (cached, chunk) in enumerate(requests):
        pages = order[used : used + num_pages_of[i]]
        used += num_pages_of[i]
        block_table[i, : len(pages)] = pages
        positions = np.arange(cached + chunk)
        request_slots = torch.from_numpy(pages[positions // block_size] * block_size + positions % block_size)
        request_slots = request_slots.cuda()
        k, v = (torch.randn(cached + chunk, kv_heads, HEAD_DIM, generator=generator, device="cuda").to(dtype)
                for _ in "kv")
        write_kv(k[:cached], v[:cached], k_cache, v_cache, request_slots[:cached])
        slots.append(request_slots[cached:])
        # Doubled queries make attention peaked, so a wrong or missing key shows in the output.
        qs.append((2 * torch.randn(chunk, q_heads, HEAD_DIM, generator=generator, device="cuda")).to(dtype))
        ks.append(k[cached:])
        vs.append(v[cached:])
    query_start = np.concatenate([[0], np.cumsum([chunk for _, chunk in requests])]).astype(np.int32)
    query_lens = np.diff(query_start)
    meta = AttentionMetadata(
        query_start=torch.from_numpy(query_start).cuda(), seq_lens=torch.from_numpy(seq_lens).cuda(),
        block_table=torch.from_numpy(block_table).cuda(), kv_index=torch.cat(slots),
        query_start_cpu=query_start, seq_lens_cpu=seq_lens,
        max_query_len=int(query_lens.max()), max_seq_len=int(seq_lens.max()),
    )
    return Step(torch.cat(qs), torch.cat(ks), torch.cat(vs), k_cache, v_cache, meta)


def check_against_float32_reference(triton_attention, step: Step, label: str) -> None:
    # fp8 pages stay fp8: the reference reads (and writes) the values the cache holds
    k_ref, v_ref = (cache.clone() if cache.element_size() == 1 else cache.to(torch.float32, copy=True)
                    for cache in (step.k_cache, step.v_cache))
    with exact_float32_sdpa(torch.float32):
        expected = ReferenceAttention().forward(step.q.float(), step.k.float(), step.v.float(), k_ref, v_ref,
                                                step.meta, SCALE)
    k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
    out = triton_attention("cuda").forward(step.q, step.k, step.v, k_cache, v_cache, step.meta, SCALE)
    torch.cuda.synchronize()
    assert out.dtype == step.q.dtype and out.shape == step.q.shape
    assert not out.isnan().any(), f"{label}: NaN in the output (a kernel read an unwritten slot)"
    torch.testing.assert_close(k_cache.float(), k_ref.float(), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_cache.float(), v_ref.float(), rtol=0, atol=0, equal_nan=True)
    query_start, worst = step.meta.query_start_cpu, 0.0
    for i in range(len(step.meta.seq_lens_cpu)):
        start, end = int(query_start[i]), int(query_start[i + 1])
        if end == start:
            continue
        reference = expected[start:end]
        error = ((out[start:end].float() - reference).abs().max() / reference.abs().max()).item()
        worst = max(worst, error)
        assert error < TOLERANCE[step.q.dtype], (
            f"{label}: request {i} (seq_len {step.meta.seq_lens_cpu[i]}, {end - start} queries): "
            f"relative error {error:.2e}"
        )
    print(f"{label}: {len(step.meta.seq_lens_cpu)} requests, {step.q.shape[0]} queries, "
          f"worst relative error {worst:.2e}")


def edge_lengths(block_size: int) -> list[int]:
    return sorted({1, max(1, block_size - 1), block_size, block_size + 1, 63, 64, 65, 127, 128, 129})


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_decode_batch_of_mixed_lengths_equals_float32_reference(triton_attention, block_size):
    lengths = edge_lengths(block_size) + np.random.default_rng(block_size).integers(1, 4097, 48).tolist()
    requests = [(n - 1, 1) for n in lengths] + [(300, 0)]  # and a request with no query this step
    check_against_float32_reference(triton_attention, build_step(requests, block_size, seed=block_size),
                                    f"decode, block_size {block_size}")


def test_decode_of_40960_token_contexts_uses_many_splits(triton_attention):
    step = build_step([(40959, 1), (30000, 1)], 16, seed=1)
    check_against_float32_reference(triton_attention, step, "decode, 40,960 + 30,001 tokens")


def test_decode_batch_256_of_2048_tokens(triton_attention):
    step = build_step([(2047, 1)] * 256, 16, seed=2)
    check_against_float32_reference(triton_attention, step, "decode, 256 x 2,048 tokens")


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_mixed_prefill_chunks_and_decodes_equal_float32_reference(triton_attention, block_size):
    rng = np.random.default_rng(10 + block_size)
    chunks = [(0, 2048), (1536, 512), (0, 513), (700, 300), (block_size - 1, block_size + 1), (30, 2),
              (126, 130)]
    decodes = [(int(n) - 1, 1) for n in rng.integers(1, 4097, 32)] + [(0, 1)]
    step = build_step(chunks + decodes + [(99, 0)], block_size, seed=block_size)
    check_against_float32_reference(triton_attention, step, f"mixed step, block_size {block_size}")


def test_short_chunks_only_equal_float32_reference(triton_attention):
    """Every chunk at most 64 queries: one query block a request, mostly padding."""
    step = build_step([(0, 64), (100, 33), (5, 2), (4000, 17)], 16, seed=3)
    check_against_float32_reference(triton_attention, step, "short chunks")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_float16_and_float32_caches_equal_float32_reference(triton_attention, dtype):
    requests = [(0, 300), (200, 70), (17, 1), (2000, 1), (0, 1), (64, 0)]
    check_against_float32_reference(triton_attention, build_step(requests, 16, dtype, seed=4), str(dtype))


@pytest.mark.parametrize("dtype,tolerance", [("bfloat16", 3e-2), ("float32", 1e-4)])
def test_model_logits_through_triton_equal_reference_backend(dtype, tolerance):
    """qwen3-tiny (4 layers, 4 query / 2 KV heads, head_dim 64) with the same dummy weights: a chunked
    prefill alongside a short prompt, then decodes of both; every step's logits must agree."""
    config = EngineConfig(model=ModelConfig.from_name("qwen3-tiny", dtype=dtype),
                          cache=CacheConfig(block_size=16, num_pages=64), device="cuda")
    runner = ModelRunner(config, show_progress=False)
    assert runner.backend.name == "triton", "the runner's default backend on CUDA is triton"
    reference = ModelRunner(config, backend=ReferenceAttention(), show_progress=False)
    rng = np.random.default_rng(0)
    long_prompt, short_prompt = rng.integers(0, 151_000, 300).tolist(), rng.integers(0, 151_000, 45).tolist()
    long_pages, short_pages = list(range(0, 20)), list(range(40, 44))
    steps = [
        [Chunk(long_prompt[:200], 0, long_pages, sample=False), Chunk(short_prompt, 0, short_pages)],
        [Chunk(long_prompt[200:], 200, long_pages), Chunk([11], 45, short_pages)],
    ]
    steps += [[Chunk([5 + i], 300 + i, long_pages), Chunk([9 + i], 46 + i, short_pages)] for i in range(3)]
    plans = [make_plan(chunks, 16, step_id=step_id) for step_id, chunks in enumerate(steps)]
    for step_id, plan in enumerate(plans):
        ours, rows = runner.forward_logits(plan)
        with exact_float32_sdpa(getattr(torch, dtype)):
            theirs, _ = reference.forward_logits(plan)
        error = float((ours - theirs).abs().max() / theirs.abs().max())
        print(f"{dtype} step {step_id}: {len(rows)} sampled rows, relative logits error {error:.2e}")
        assert error < tolerance, f"{dtype} step {step_id}: relative logits error {error:.2e}"


def test_attention_over_fp8_pages_in_bf16_equals_the_float32_reference_over_them(triton_attention):
    """--kv-cache-dtype fp8: the step's prefix in fp8 pages, its new rows written by the kernel; the
    float32 reference reads the same fp8 values, so only bf16's rounding separates them."""
    from core.execution.kv_cache import FP8_KV_DTYPE, to_cache_dtype

    rng = np.random.default_rng(11)
    decodes = [(int(n) - 1, 1) for n in rng.integers(1, 4097, 32)]
    step = build_step([(0, 300), (1536, 512), (30, 2), (700, 1), *decodes], 16, seed=11)
    step = Step(step.q, step.k, step.v, to_cache_dtype(step.k_cache, FP8_KV_DTYPE),
                to_cache_dtype(step.v_cache, FP8_KV_DTYPE), step.meta)
    check_against_float32_reference(triton_attention, step, "fp8 pages, bf16 queries")
