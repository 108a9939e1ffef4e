"""TritonAttention equals ReferenceAttention: the KV write puts every row in its slot, decode (split or
not) and extend give the reference's output for any mix of requests, page layout and block size.

The kernels run on the CPU through the Triton interpreter, so shapes stay small. The interpreter is
only on if TRITON_INTERPRET=1 is set before triton is first imported. Run alone, this file sets it
itself; in a full test run an earlier module has usually imported triton already (transformers
imports torch._dynamo, which imports triton), and then `test_kernels_in_a_fresh_interpreter`
runs this file again in a child process. The interpreter's bfloat16 tl.dot is wrong (triton 3.9),
so bfloat16 attention is checked by tests/gpu/test_gpu_triton_attention.py; here float32 and
float16. Unwritten cache slots hold NaN: a kernel that reads a slot outside its request's context fails.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from triton_interpreter import is_interpreted, run_in_fresh_interpreter, skip_unless_interpreted  # noqa: E402

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]')")

from plans import Chunk, make_plan  # noqa: E402
from tiny_models import build_tiny_checkpoint  # noqa: E402

from core.config import CacheConfig, EngineConfig, ModelConfig  # noqa: E402
from core.execution.attention import make_backend  # noqa: E402
from core.execution.attention.backend import AttentionMetadata, write_kv  # noqa: E402
from core.execution.attention.reference import ReferenceAttention  # noqa: E402
from core.execution.attention.triton_backend import TritonAttention  # noqa: E402
from core.execution.attention.triton_decode import (  # noqa: E402
    MAX_SPLITS,
    DecodeSplits,
    _decode_split_kernel,
    decode_attention,
    decode_tiles,
    plan_splits,
)
from core.execution.attention.triton_extend import ExtendTiles, extend_tiles, extend_work_list  # noqa: E402
from core.execution.attention.triton_kv_write import write_kv_paged  # noqa: E402
from core.execution.runner import ModelRunner  # noqa: E402

# Both triton's own library (tl.zeros, tl.max, ...) and our kernels must have been built interpreted.
INTERPRETED = is_interpreted(triton.language.zeros, _decode_split_kernel)


@pytest.fixture(autouse=True)
def _kernels_run_here_or_in_the_child(request):
    skip_unless_interpreted(request, INTERPRETED)


def test_kernels_in_a_fresh_interpreter():
    run_in_fresh_interpreter(__file__, INTERPRETED)


HEAD_DIM = 32
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3}


@dataclass
class Step:
    """One step's new q/k/v rows and metadata, over caches that already hold every request's prefix."""

    q: torch.Tensor  # [T, q_heads, head_dim]
    k: torch.Tensor  # [T, kv_heads, head_dim]
    v: torch.Tensor
    k_cache: torch.Tensor  # [num_pages, block_size, kv_heads, head_dim]; NaN where nothing was written
    v_cache: torch.Tensor
    meta: AttentionMetadata


def make_meta(query_start: np.ndarray, seq_lens: np.ndarray, block_table: np.ndarray,
              kv_index: np.ndarray) -> AttentionMetadata:
    query_lens = np.diff(query_start)
    return AttentionMetadata(
        query_start=torch.from_numpy(query_start), seq_lens=torch.from_numpy(seq_lens),
        block_table=torch.from_numpy(block_table), kv_index=torch.from_numpy(kv_index),
        query_start_cpu=query_start, seq_lens_cpu=seq_lens,
        max_query_len=int(query_lens.max()), max_seq_len=int(seq_lens.max()),
    )


def build_step(requests: list[tuple[int, int]], block_size: int, q_heads: int, kv_heads: int,
               dtype: torch.dtype = torch.float32, head_dim: int = HEAD_DIM, seed: int = 0) -> Step:
    """requests: (cached_len, chunk_len) each; a chunk of 0 is a request with no query this step.
    Pages are a random permutation of the pool, so no request's pages are contiguous or ordered."""
    generator = torch.Generator().manual_seed(seed)
    seq_lens = np.array([cached + chunk for cached, chunk in requests], np.int32)
    num_pages_of = [-(-int(n) // block_size) for n in seq_lens]
    num_pages = sum(num_pages_of) + 2
    order = torch.randperm(num_pages, generator=generator).numpy()
    block_table = np.zeros((len(requests), max(num_pages_of)), np.int32)
    cache_shape = (num_pages, block_size, kv_heads, head_dim)
    k_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    v_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    used, slots, rows = 0, [], {"q": [], "k": [], "v": []}
    for i, (cached, chunk) in enumerate(requests):
        pages = order[used : used + num_pages_of[i]]
        used += num_pages_of[i]
        block_table[i, : len(pages)] = pages
        positions = np.arange(cached + chunk)
        request_slots = torch.from_numpy(pages[positions // block_size] * block_size + positions % block_size)
        k, v = (torch.randn(cached + chunk, kv_heads, head_dim, generator=generator).to(dtype) for _ in "kv")
        # The prefix was written by earlier steps; this step's chunk is written by the backend.
        write_kv(k[:cached], v[:cached], k_cache, v_cache, request_slots[:cached])
        slots.append(request_slots[cached:])
        rows["q"].append(torch.randn(chunk, q_heads, head_dim, generator=generator).to(dtype))
        rows["k"].append(k[cached:])
        rows["v"].append(v[cached:])
    query_start = np.concatenate([[0], np.cumsum([chunk for _, chunk in requests])]).astype(np.int32)
    kv_index = torch.cat(slots).numpy().astype(np.int64)
    meta = make_meta(query_start, seq_lens, block_table, kv_index)
    return Step(torch.cat(rows["q"]), torch.cat(rows["k"]), torch.cat(rows["v"]), k_cache, v_cache, meta)


def reference_output(step: Step) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ReferenceAttention in float32 on copies of the caches: (output, k_cache, v_cache) after the step."""
    k_cache, v_cache = (cache.to(torch.float32, copy=True) for cache in (step.k_cache, step.v_cache))
    out = ReferenceAttention().forward(step.q.float(), step.k.float(), step.v.float(), k_cache, v_cache,
                                       step.meta, HEAD_DIM**-0.5)
    return out, k_cache, v_cache


def assert_close_to_reference(step: Step, out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              expected: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    expected_out, expected_k, expected_v = expected
    assert out.dtype == step.q.dtype and out.shape == step.q.shape
    assert not out.isnan().any(), "NaN in the output: a kernel read a slot outside its request's context"
    query_start = step.meta.query_start_cpu
    for i in range(len(step.meta.seq_lens_cpu)):
        start, end = int(query_start[i]), int(query_start[i + 1])
        error = (out[start:end].float() - expected_out[start:end]).abs().max().item() if end > start else 0.0
        assert error < TOLERANCE[out.dtype], (
            f"request {i} (seq_len {step.meta.seq_lens_cpu[i]}, {end - start} queries): error {error:.2e}"
        )
    torch.testing.assert_close(k_cache.float(), expected_k, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_cache.float(), expected_v, rtol=0, atol=0, equal_nan=True)


def run_triton(step: Step, backend: TritonAttention | None = None) -> tuple[torch.Tensor, ...]:
    backend = backend or TritonAttention("cpu")
    k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
    out = backend.forward(step.q, step.k, step.v, k_cache, v_cache, step.meta, HEAD_DIM**-0.5)
    return out, k_cache, v_cache


# --- KV write ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_kv_write_kernel_puts_each_row_where_index_copy_does(block_size, dtype):
    num_pages, kv_heads, num_tokens = 7, 2, 2 * block_size + 3
    generator = torch.Generator().manual_seed(block_size)
    k_cache = torch.randn(num_pages, block_size, kv_heads, HEAD_DIM, generator=generator).to(dtype)
    v_cache = torch.randn(num_pages, block_size, kv_heads, HEAD_DIM, generator=generator).to(dtype)
    # K and V as the model hands them over: column slices of one packed qkv row, not contiguous.
    qkv = torch.randn(num_tokens, 3 * kv_heads * HEAD_DIM, generator=generator).to(dtype)
    k = qkv[:, kv_heads * HEAD_DIM : 2 * kv_heads * HEAD_DIM].view(num_tokens, kv_heads, HEAD_DIM)
    v = qkv[:, 2 * kv_heads * HEAD_DIM :].view(num_tokens, kv_heads, HEAD_DIM)
    slots = torch.randperm(num_pages * block_size, generator=generator)[:num_tokens]
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    write_kv(k, v, expected_k, expected_v, slots)

    write_kv_paged(k, v, k_cache, v_cache, slots)

    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_kv_write_kernel_skips_negative_slots():
    k_cache = torch.zeros(2, 4, 1, HEAD_DIM)
    v_cache = torch.zeros(2, 4, 1, HEAD_DIM)
    k, v = torch.ones(2, 1, HEAD_DIM), torch.full((2, 1, HEAD_DIM), 2.0)
    write_kv_paged(k, v, k_cache, v_cache, torch.tensor([5, -1]))
    assert torch.equal(k_cache[1, 1, 0], k[0, 0]) and torch.equal(v_cache[1, 1, 0], v[0, 0])
    assert k_cache.count_nonzero() == HEAD_DIM and v_cache.count_nonzero() == HEAD_DIM


# --- decode --------------------------------------------------------------------------------------


def edge_contexts(block_size: int) -> list[int]:
    """Context lengths around page and tile boundaries, and 1."""
    return sorted({1, max(1, block_size - 1), block_size, block_size + 1, 2 * block_size + 1, 33, 70})


@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("q_heads, kv_heads", [(4, 4), (6, 2), (5, 1)], ids=["mha", "gqa3", "mqa5"])
def test_decode_step_equals_reference(block_size, q_heads, kv_heads):
    requests = [(n - 1, 1) for n in edge_contexts(block_size)] + [(9, 0)]  # and one with no query
    step = build_step(requests, block_size, q_heads, kv_heads, seed=block_size + q_heads)
    assert_close_to_reference(step, *run_triton(step), reference_output(step))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("split_tiles", [1, 2, 100])
def test_decode_splits_combine_to_the_reference(dtype, split_tiles):
    """Any split length (in tiles): requests shorter than the split leave later splits empty, and a
    split may end inside a page; one split writes the output without the reduce."""
    requests = [(0, 1), (16, 1), (150, 1), (63, 1), (40, 0), (95, 1)]
    step = build_step(requests, 16, 4, 2, dtype, seed=split_tiles)
    expected = reference_output(step)
    write_kv_paged(step.k, step.v, step.k_cache, step.v_cache, step.meta.kv_index)
    split_tokens = split_tiles * decode_tiles(dtype).block_n
    num_splits = -(-step.meta.max_seq_len // split_tokens)
    shape = (len(step.meta.seq_lens_cpu), 4, num_splits)
    partial_out = torch.empty(*shape, HEAD_DIM) if num_splits > 1 else None
    partial_lse = torch.empty(*shape) if num_splits > 1 else None
    out = torch.full_like(step.q, float("nan"))
    decode_attention(step.q, step.k_cache, step.v_cache, out, step.meta.block_table, step.meta.seq_lens,
                     step.meta.query_start, HEAD_DIM**-0.5, DecodeSplits(num_splits, split_tokens),
                     partial_out, partial_lse)
    assert_close_to_reference(step, out, step.k_cache, step.v_cache, expected)


def test_split_plan_fills_the_gpu_without_tiny_splits():
    # Qwen3-14B on an H200 (132 SMs), 2,048-token contexts.
    one = plan_splits(1, 8, 2048, 132, 64)
    assert one.num_splits * one.split_tokens >= 2048 and one.split_tokens >= 128 and one.num_splits > 8
    assert plan_splits(256, 8, 2048, 132, 64).num_splits == 1
    for num_decodes, max_seq_len in [(1, 1), (1, 40960), (3, 17), (16, 2048), (64, 2048), (1000, 5)]:
        splits = plan_splits(num_decodes, 8, max_seq_len, 132, 64)
        assert splits.split_tokens % 64 == 0
        assert 1 <= splits.num_splits <= MAX_SPLITS
        covered = splits.num_splits * splits.split_tokens
        assert covered - splits.split_tokens < max_seq_len <= covered, "no split may be empty"


# --- extend and mixed steps ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_mixed_step_equals_reference(block_size, dtype):
    """Fresh prefills, chunks over a cached prefix, decodes, a request of one token (seq_len 1) and one
    with no query this step, all in one step. Chunks starting two keys before the end of a key tile
    (30, 62) catch a diagonal tile treated as unmasked."""
    requests = [(0, 37), (45, 20), (block_size - 1, block_size + 1), (16, 1), (0, 1), (20, 0), (3, 2),
                (70, 1), (30, 3), (62, 3)]
    step = build_step(requests, block_size, 6, 2, dtype, seed=block_size)
    assert_close_to_reference(step, *run_triton(step), reference_output(step))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fresh_prefills_read_the_steps_own_keys_and_equal_the_paged_path(dtype):
    """A step whose extending requests have no cached prefix (decodes beside them) reads the keys
    from its own K/V rows, not the pages: the reference's output, and the paged path's bit for bit,
    with V a strided view as the model's qkv split gives it."""
    requests = [(0, 37), (0, 2), (16, 1), (0, 70), (5, 1)]
    step = build_step(requests, 16, 4, 2, dtype, seed=11)
    qkv = torch.cat([step.q.flatten(1), step.k.flatten(1), step.v.flatten(1)], dim=1)
    v_view = qkv[:, -step.v[0].numel():].view(step.v.shape)  # row stride q + k + v, as in the model
    backend = TritonAttention("cpu")
    k_cache, v_cache = step.k_cache.clone(), step.v_cache.clone()
    out = backend.forward(step.q, step.k, v_view, k_cache, v_cache, step.meta, HEAD_DIM**-0.5)
    assert backend.launch_state().fresh
    assert_close_to_reference(step, out, k_cache, v_cache, reference_output(step))
    paged = backend.attend(step.q, k_cache, v_cache, step.meta, HEAD_DIM**-0.5)
    torch.testing.assert_close(out, paged, rtol=0, atol=0)
    cached = build_step([(3, 37), (0, 2)], 16, 4, 2, dtype, seed=11)
    run_triton(cached, backend)
    assert not backend.launch_state().fresh  # a chunk after a cached prefix reads the pages


def test_half_precision_tiles_follow_chunk_and_context_length():
    assert extend_tiles(torch.float16, 64, 4000) == ExtendTiles(64, 64, 4, 2)
    assert extend_tiles(torch.bfloat16, 65, 512) == ExtendTiles(64, 32, 4, 2)
    assert extend_tiles(torch.bfloat16, 65, 513) == ExtendTiles(128, 128, 8, 3)
    assert extend_tiles(torch.float32, 2048, 4000).block_m == 16


@pytest.mark.parametrize("requests", [[(10, 150), (0, 66), (130, 1)], [(400, 150), (0, 20), (600, 1)]],
                         ids=["64x32 tiles", "128x128 tiles"])
def test_long_chunks_use_several_query_tiles_and_equal_reference(requests):
    """float16 chunks longer than 64 queries: 64-row tiles while no request reads more than 512 keys
    (150 queries span three), 128 x 128 tiles beyond (two, the first over four key tiles of prefix)."""
    step = build_step(requests, 16, 2, 1, torch.float16, seed=5)
    assert_close_to_reference(step, *run_triton(step), reference_output(step))


@st.composite
def steps(draw):
    """A random step: up to five requests, each a decode, a chunk over a prefix or an idle request."""
    block_size = draw(st.sampled_from([1, 2, 16, 32]))
    q_heads, kv_heads = draw(st.sampled_from([(2, 2), (4, 2), (3, 1), (6, 3)]))
    dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    requests = draw(st.lists(st.tuples(st.integers(0, 80), st.sampled_from([0, 1, 1, 2, 7, 40, 70])),
                             min_size=1, max_size=5))
    requests = [(cached, chunk) if cached + chunk else (0, 1) for cached, chunk in requests]
    if all(chunk == 0 for _, chunk in requests):
        requests.append((5, 1))
    return requests, block_size, q_heads, kv_heads, dtype, draw(st.integers(0, 2**16))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps())
def test_any_step_equals_reference(step_spec):
    requests, block_size, q_heads, kv_heads, dtype, seed = step_spec
    step = build_step(requests, block_size, q_heads, kv_heads, dtype, seed=seed)
    assert_close_to_reference(step, *run_triton(step), reference_output(step))


def test_extend_work_list_covers_every_query_block_once_heaviest_first():
    query_start = np.array([0, 1, 1, 40, 42, 142], np.int32)  # a decode, an empty, 39, 2 and 100 queries
    seq_lens = np.array([5, 3, 39, 12, 300], np.int32)
    work = extend_work_list(query_start, seq_lens, block_m=16)
    pairs = sorted(zip(work[0].tolist(), work[1].tolist()))
    assert pairs == [(2, b) for b in range(3)] + [(3, 0)] + [(4, b) for b in range(7)]
    keys_read = [seq_lens[r] - np.diff(query_start)[r] + min(16 * (b + 1), np.diff(query_start)[r])
                 for r, b in zip(work[0], work[1])]
    assert keys_read == sorted(keys_read, reverse=True)


def test_chunked_schedule_over_two_layers_equals_reference_step_by_step():
    """Several steps through one two-layer cache: the per-step launch plan is rebuilt for each new
    step and reused by the second layer, which has its own pages."""
    block_size, q_heads, kv_heads = 16, 4, 2
    generator = torch.Generator().manual_seed(3)
    seq_lens = [53, 20, 9]
    num_pages = sum(-(-n // block_size) for n in seq_lens) + 2
    order = torch.randperm(num_pages, generator=generator).tolist()
    pages = [order[0:4], order[4:6], order[6:7]]
    q, k, v = ([torch.randn(n, heads, HEAD_DIM, generator=generator) for n in seq_lens]
               for heads in (q_heads, kv_heads, kv_heads))
    steps = [[(0, 0, 13)], [(0, 13, 50), (1, 0, 19)], [(0, 50, 51), (1, 19, 20), (2, 0, 7)],
             [(2, 7, 8), (0, 51, 52)], [(0, 52, 53), (2, 8, 9)]]
    caches = {name: torch.full((2, 2, num_pages, block_size, kv_heads, HEAD_DIM), float("nan"))
              for name in ("reference", "triton")}
    backends = {"reference": ReferenceAttention(), "triton": TritonAttention("cpu")}
    for step_id, step in enumerate(steps):
        chunks = [Chunk([0] * (end - start), start, pages[r]) for r, start, end in step]
        meta = AttentionMetadata.from_plan(make_plan(chunks, block_size, step_id=step_id), "cpu")
        rows = [torch.cat([t[r][start:end] for r, start, end in step]) for t in (q, k, v)]
        outputs = {}
        for name, backend in backends.items():
            # Layer 1 gets other values than layer 0, as a real model's layers do.
            outputs[name] = [
                backend.forward(rows[0] * (1 + layer), rows[1] - layer, rows[2] * (1 - layer),
                                caches[name][layer, 0], caches[name][layer, 1], meta, HEAD_DIM**-0.5)
                for layer in range(2)
            ]
        for layer in range(2):
            error = (outputs["triton"][layer] - outputs["reference"][layer]).abs().max().item()
            assert error < TOLERANCE[torch.float32], f"step {step_id}, layer {layer}: error {error:.2e}"
        torch.testing.assert_close(caches["triton"], caches["reference"], rtol=0, atol=0, equal_nan=True)


# --- the model and the wiring --------------------------------------------------------------------


def test_model_logits_through_triton_equal_reference(tmp_path):
    build_tiny_checkpoint(tmp_path, seed=2)
    config = EngineConfig(model=ModelConfig.from_pretrained(tmp_path, dtype="float32"),
                          cache=CacheConfig(block_size=16, num_pages=16), device="cpu")
    runners = {name: ModelRunner(config, backend=make_backend(name, "cpu"), show_progress=False)
               for name in ("reference", "triton")}
    prompt = np.random.default_rng(0).integers(0, 256, size=40).tolist()
    pages = [9, 2, 14]
    # A prefill in two chunks, then a decode; each step's logits must agree.
    plans = [make_plan([Chunk(prompt[:23], 0, pages)], 16), make_plan([Chunk(prompt[23:], 23, pages)], 16),
             make_plan([Chunk([7], 40, pages)], 16)]
    for step_id, plan in enumerate(plans):
        logits = {name: runner.forward_logits(plan)[0] for name, runner in runners.items()}
        error = (logits["triton"] - logits["reference"]).abs().max() / logits["reference"].abs().max()
        assert error < 1e-5, f"step {step_id}: relative logits error {error:.2e}"


def test_make_backend_names_the_backends_and_the_runner_defaults_to_reference_on_cpu(tmp_path):
    assert make_backend("reference", "cpu").name == "reference"
    assert make_backend("triton", "cpu").name == "triton"
    with pytest.raises(ValueError, match="unknown attention backend 'flash'.*reference, triton"):
        make_backend("flash", "cpu")
    build_tiny_checkpoint(tmp_path, seed=1)
    config = EngineConfig(model=ModelConfig.from_pretrained(tmp_path, dtype="float32"),
                          cache=CacheConfig(block_size=16, num_pages=4), device="cpu")
    assert ModelRunner(config, show_progress=False).backend.name == "reference"
