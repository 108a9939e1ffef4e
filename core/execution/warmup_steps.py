"""The steps a GPU runner runs on a scratch cache at start, before serving: which request shapes
(`compile_warmup_steps`) make Triton compile every attention variant serving can reach outside the
decode graphs, and the plan of such a step (`warmup_plan`). Used by core/execution/runner.py.
"""

from __future__ import annotations

import numpy as np

from core.plan import StepPlan


def warmup_plan(requests: list[tuple[int, int]], block_size: int, vocab_size: int) -> StepPlan:
    """A step of (cached, chunk) requests over consecutive pages 0.. of a scratch cache, every request
    sampling at SamplingParams' defaults."""
    num_reqs = len(requests)
    cached = np.array([c for c, _ in requests], np.int64)
    chunks = np.array([n for _, n in requests], np.int64)
    seq_lens = cached + chunks
    pages = -(-seq_lens // block_size)
    first_page = np.concatenate([[0], np.cumsum(pages)[:-1]])
    block_table = np.zeros((num_reqs, int(pages.max())), np.int32)
    for i in range(num_reqs):
        block_table[i, : pages[i]] = np.arange(first_page[i], first_page[i] + pages[i])
    query_start = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int32)
    positions = np.concatenate([np.arange(c, c + n) for c, n in requests])
    row = np.repeat(np.arange(num_reqs), chunks)
    slots = first_page[row] * block_size + positions
    num_tokens = int(query_start[-1])
    return StepPlan(
        step_id=-1, replica=0, query_start=query_start, seq_lens=seq_lens.astype(np.int32),
        block_table=block_table, logits_index=query_start[1:] - 1,
        input_ids=(np.arange(num_tokens, dtype=np.int64) * 7919 % vocab_size).astype(np.int32),
        positions=positions.astype(np.int32), kv_index=slots.astype(np.int64),
    )


def compile_warmup_steps(max_model_len: int, max_tokens: int) -> list[list[tuple[int, int]]]:
    """Steps whose shapes make Triton compile, before the first request, every attention kernel
    variant that serving can reach outside the decode graphs: each extend tile family (chunks of at
    most 64 queries, chunks reading at most 512 keys, longer ones), each over fresh prompts (keys
    read from the step's own rows) and over a cached prefix (keys read from the pages), and eager
    decodes over one split and over each reduce block size. Without them the first requests of a
    fresh server wait a second or two for the compiler. Steps that do not fit the configured
    lengths are left out."""
    steps = [[(0, 2), (4, 1)], [(4, 2)], [(0, 65), (999, 1)], [(8, 65)], [(0, 999)], [(8, 999)],
             [(4095, 1)], [(8191, 1)]]
    return [step for step in steps
            if sum(n for _, n in step) <= max_tokens and all(c + n <= max_model_len for c, n in step)]
