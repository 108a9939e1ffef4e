"""The reference paged attention backend computes dense causal attention, whatever the page layout,
block size, chunking or batching; write_kv puts every token's K/V in its slot and nowhere else."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plans import Chunk, make_plan

from core.execution.attention.backend import AttentionMetadata, write_kv
from core.execution.attention.reference import ReferenceAttention
from core.execution.kv_cache import KVCache

HEAD_DIM = 8


@dataclass
class Sequence:
    """One request's whole q/k/v, [seq_len, heads, head_dim], and the pages it owns."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    pages: list[int]


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(Q K^T * scale + causal mask) V in float64, query head h reading kv head h // group."""
    q, k, v = q.double(), k.double(), v.double()
    seq_len, q_heads, _ = q.shape
    group = q_heads // k.shape[1]
    kv_head = torch.arange(q_heads) // group
    k, v = k[:, kv_head], v[:, kv_head]  # [seq_len, q_heads, head_dim]
    scores = torch.einsum("ihd,jhd->hij", q, k) * scale
    future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.einsum("hij,jhd->ihd", scores.softmax(-1), v)


def make_sequences(seq_lens: list[int], q_heads: int, kv_heads: int, block_size: int, spare_pages: int,
                   seed: int) -> tuple[list[Sequence], int]:
    """Random q/k/v per request and a random permutation of pages; returns them and num_pages."""
    generator = torch.Generator().manual_seed(seed)
    needed = [-(-n // block_size) for n in seq_lens]
    num_pages = sum(needed) + spare_pages
    order = torch.randperm(num_pages, generator=generator).tolist()
    sequences, used = [], 0
    for seq_len, n in zip(seq_lens, needed):
        q, k, v = (torch.randn(seq_len, heads, HEAD_DIM, generator=generator)
                   for heads in (q_heads, kv_heads, kv_heads))
        sequences.append(Sequence(q, k, v, order[used : used + n]))
        used += n
    return sequences, num_pages


def run_steps(sequences: list[Sequence], steps: list[list[tuple[int, int, int]]], num_pages: int,
              block_size: int) -> list[dict[int, torch.Tensor]]:
    """Run each step, a list of (request, start, end) chunks, through one cache; return every step's
    output per request, [end - start, q_heads, head_dim]."""
    kv_heads = sequences[0].k.shape[1]
    cache = KVCache(1, num_pages, block_size, kv_heads, HEAD_DIM, torch.float32, "cpu")
    # Stale values in every slot: attention must never read a slot this request has not written.
    cache.storage.normal_(generator=torch.Generator().manual_seed(99))
    k_cache, v_cache = cache.layer(0)
    backend, scale = ReferenceAttention(), HEAD_DIM**-0.5
    outputs = []
    for step_id, step in enumerate(steps):
        chunks = [Chunk([0] * (end - start), start, sequences[r].pages) for r, start, end in step]
        meta = AttentionMetadata.from_plan(make_plan(chunks, block_size, step_id=step_id), "cpu")

        q, k, v = (torch.cat([getattr(sequences[r], field)[start:end] for r, start, end in step])
                   for field in ("q", "k", "v"))
        out = backend.forward(q, k, v, k_cache, v_cache, meta, scale)
        bounds = np.cumsum([0] + [end - start for _, start, end in step])
        outputs.append({r: out[bounds[i] : bounds[i + 1]] for i, (r, _, _) in enumerate(step)})
    return outputs


def assert_matches_dense(sequences: list[Sequence], steps, outputs) -> None:
    scale = HEAD_DIM**-0.5
    dense = [dense_causal_attention(s.q, s.k, s.v, scale) for s in sequences]
    for step_id, (step, out) in enumerate(zip(steps, outputs)):
        for r, start, end in step:
            error = (out[r].double() - dense[r][start:end]).abs().max().item()
            assert error < 1e-5, f"step {step_id}, request {r}, tokens {start}..{end - 1}: error {error:.2e}"


@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("q_heads, kv_heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa2", "mqa"])
def test_single_prefill_equals_dense_causal_attention(block_size, q_heads, kv_heads):
    sequences, num_pages = make_sequences([45], q_heads, kv_heads, block_size, spare_pages=3, seed=block_size)
    steps = [[(0, 0, 45)]]
    assert_matches_dense(sequences, steps, run_steps(sequences, steps, num_pages, block_size))


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_chunks_starting_and_ending_inside_pages_then_decodes_equal_dense(block_size):
    """Request 0: a first chunk ending mid-page, a second starting there, then decodes of one token;
    request 1 prefills whole in the second step and decodes alongside; request 2 joins late."""
    sequences, num_pages = make_sequences([53, 20, 9], 4, 2, block_size, spare_pages=2, seed=7 + block_size)
    steps = [
        [(0, 0, 13)],
        [(0, 13, 50), (1, 0, 19)],
        [(0, 50, 51), (1, 19, 20), (2, 0, 7)],
        [(2, 7, 8), (0, 51, 52)],
        [(0, 52, 53), (2, 8, 9)],
    ]
    assert_matches_dense(sequences, steps, run_steps(sequences, steps, num_pages, block_size))


@st.composite
def schedules(draw):
    """Several requests, each cut into random chunks, interleaved into steps in a random order."""
    block_size = draw(st.sampled_from([1, 2, 16, 32]))
    q_heads, kv_heads = draw(st.sampled_from([(2, 2), (4, 2), (4, 1), (6, 3)]))
    num_reqs = draw(st.integers(1, 4))
    seq_lens = [draw(st.integers(1, 70)) for _ in range(num_reqs)]
    pending = []
    for r, seq_len in enumerate(seq_lens):
        cuts = sorted(draw(st.sets(st.integers(1, seq_len - 1), max_size=4))) if seq_len > 1 else []
        bounds = [0, *cuts, seq_len]
        pending.append([(r, a, b) for a, b in zip(bounds, bounds[1:])])
    steps = []
    while any(pending):
        # Each step takes the next chunk of a random non-empty subset of the unfinished requests.
        live = [r for r in range(num_reqs) if pending[r]]
        chosen = draw(st.lists(st.sampled_from(live), min_size=1, unique=True))
        steps.append([pending[r].pop(0) for r in chosen])
    seed = draw(st.integers(0, 2**16))
    return block_size, q_heads, kv_heads, seq_lens, steps, seed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_any_chunked_batched_schedule_over_shuffled_pages_equals_dense(schedule):
    block_size, q_heads, kv_heads, seq_lens, steps, seed = schedule
    sequences, num_pages = make_sequences(seq_lens, q_heads, kv_heads, block_size, spare_pages=2, seed=seed)
    assert_matches_dense(sequences, steps, run_steps(sequences, steps, num_pages, block_size))


def test_request_without_tokens_this_step_is_skipped():
    """A request with an empty chunk (query_start repeats) gets no rows and disturbs no others."""
    sequences, num_pages = make_sequences([10, 6], 4, 2, 4, spare_pages=1, seed=3)
    cache = KVCache(1, num_pages, 4, 2, HEAD_DIM, torch.float32, "cpu")
    k_cache, v_cache = cache.layer(0)
    plan = make_plan([Chunk([0] * 10, 0, sequences[0].pages), Chunk([0] * 6, 0, sequences[1].pages)], 4)
    # Drop request 1's tokens from the step but keep its row: its context is empty this step.
    plan = replace(plan, query_start=np.asarray([0, 10, 10], np.int32), kv_index=plan.kv_index[:10],
                   positions=plan.positions[:10], input_ids=plan.input_ids[:10])
    meta = AttentionMetadata.from_plan(plan, "cpu")
    s = sequences[0]
    out = ReferenceAttention().forward(s.q, s.k, s.v, k_cache, v_cache, meta, HEAD_DIM**-0.5)
    expected = dense_causal_attention(s.q, s.k, s.v, HEAD_DIM**-0.5)
    assert (out.double() - expected).abs().max() < 1e-5


@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_write_kv_puts_each_token_at_page_times_block_size_plus_offset_and_nowhere_else(block_size):
    num_pages, kv_heads, num_tokens = 9, 2, 2 * block_size + 3
    generator = torch.Generator().manual_seed(block_size)
    k_cache = torch.randn(num_pages, block_size, kv_heads, HEAD_DIM, generator=generator)
    v_cache = torch.randn(num_pages, block_size, kv_heads, HEAD_DIM, generator=generator)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    k = torch.randn(num_tokens, kv_heads, HEAD_DIM, generator=generator)
    v = torch.randn(num_tokens, kv_heads, HEAD_DIM, generator=generator)
    # Distinct random slots scattered over the pages, in no particular order.
    slots = torch.randperm(num_pages * block_size, generator=generator)[:num_tokens]

    write_kv(k, v, k_cache, v_cache, slots)

    written = torch.zeros(num_pages, block_size, dtype=torch.bool)
    for t, slot in enumerate(slots.tolist()):
        page, offset = divmod(slot, block_size)
        assert torch.equal(k_cache[page, offset], k[t]), f"token {t}: K not at page {page} offset {offset}"
        assert torch.equal(v_cache[page, offset], v[t]), f"token {t}: V not at page {page} offset {offset}"
        written[page, offset] = True
    assert torch.equal(k_cache[~written], k_before[~written]), "write_kv changed K slots it was not given"
    assert torch.equal(v_cache[~written], v_before[~written]), "write_kv changed V slots it was not given"


def test_write_kv_writes_through_a_layer_view_of_the_kv_cache():
    """KVCache.layer returns views; writes must land in the one shared storage, in that layer only."""
    cache = KVCache(3, 4, 16, 2, HEAD_DIM, torch.float32, "cpu")
    k_cache, v_cache = cache.layer(1)
    k, v = torch.ones(2, 2, HEAD_DIM), torch.full((2, 2, HEAD_DIM), 2.0)
    write_kv(k, v, k_cache, v_cache, torch.tensor([5, 3 * 16 + 15]))
    assert torch.equal(cache.storage[1, 0, 0, 5], k[0]) and torch.equal(cache.storage[1, 0, 3, 15], k[1])
    assert torch.equal(cache.storage[1, 1, 0, 5], v[0]) and torch.equal(cache.storage[1, 1, 3, 15], v[1])
    assert cache.storage.count_nonzero() == 2 * 2 * 2 * HEAD_DIM


def test_reference_forward_writes_the_steps_kv_into_its_slots():
    sequences, num_pages = make_sequences([21], 4, 2, 16, spare_pages=2, seed=11)
    cache = KVCache(1, num_pages, 16, 2, HEAD_DIM, torch.float32, "cpu")
    k_cache, v_cache = cache.layer(0)
    s = sequences[0]
    plan = make_plan([Chunk([0] * 21, 0, s.pages)], 16)
    ReferenceAttention().forward(s.q, s.k, s.v, k_cache, v_cache, AttentionMetadata.from_plan(plan, "cpu"),
                                 HEAD_DIM**-0.5)
    flat_k = k_cache.reshape(-1, 2, HEAD_DIM)
    assert torch.equal(flat_k[torch.from_numpy(plan.kv_index)], s.k)
    assert cache.storage.count_nonzero() == 2 * 21 * 2 * HEAD_DIM


@pytest.mark.parametrize("query_block", [1, 5, 16])
def test_long_chunks_computed_in_query_blocks_still_equal_dense(query_block, monkeypatch):
    """A chunk longer than the reference backend's query block goes through SDPA a block at a time
    (each block seeing the keys up to its last query); whole prompts and chunks after a prefix,
    mid-page starts and GQA included, still equal dense causal attention."""
    from core.execution.attention import reference

    calls = []
    blocked = reference._attend_in_blocks
    monkeypatch.setattr(reference, "_QUERY_BLOCK", query_block)
    monkeypatch.setattr(reference, "_attend_in_blocks", lambda *a: calls.append(a[0].shape[0]) or blocked(*a))
    sequences, num_pages = make_sequences([53, 20, 9], 4, 2, 16, spare_pages=2, seed=11)
    steps = [[(0, 0, 13), (2, 0, 9)], [(0, 13, 50), (1, 0, 19)], [(0, 50, 53), (1, 19, 20)]]
    assert_matches_dense(sequences, steps, run_steps(sequences, steps, num_pages, 16))
    assert sorted(calls) == sorted(n for n in (13, 9, 37, 19, 3, 1) if n > query_block)
