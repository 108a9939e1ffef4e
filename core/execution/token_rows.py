"""A small step that is not a pure decode, run by the decode CUDA graphs: one row per token.

A step of a few new tokens (a short prompt, the new end of a prompt whose prefix the cache holds,
a few decodes beside them) runs eagerly: its forward launches some 600 kernels from Python, which
on an H100 took the host 15.5 ms (bf16) and 26.1 ms (FP8) for a 16-token prefill whose kernels ran
in ~8 ms (docs/reports/h100/fp8/ttft). So such a prompt waited 47-61 ms for its first token,
as long as a 1,784-token one. The decode graphs already launch a whole step at once, and a decode
step is rows of one query each, over its request's pages up to its own position. A chunk of n
tokens at positions c .. c+n-1 is exactly n such rows: every layer writes all rows' K/V before any
row attends (core/execution/attention), so the row at position p sees its request's tokens up to
p, its own chunk's earlier ones included: causal attention, as the extend kernel computes it (in
another summation order). `as_token_rows` turns a step into those rows; the runner replays the
graph of the step's token count and takes the logits of the rows that sample.

The price: each row reads its context's K/V itself, where the extend kernel reads a chunk's
context once. `extra_kv_reads` counts the token-reads that adds, and the runner takes this path only
below TOKEN_ROWS_MAX_EXTRA_KV_READS (64k token-reads are ~10 GB of bf16 K/V of Qwen3-14B, ~2-3 ms
on an H100, against the ~7-18 ms of host time saved). Steps that score prompt tokens stay eager.
"""

from __future__ import annotations

import numpy as np

from core.plan import StepPlan

TOKEN_ROWS_MAX_EXTRA_KV_READS = 65_536


def as_token_rows(plan: StepPlan) -> StepPlan:
    """The step as one decode row per token, in the step's token order: row t has the query of token
    t at its position, the pages of its request and a context of position + 1 tokens. Row t's logits
    are token t's, so a request's logits are those of row plan.logits_index[request]. Only the fields
    a decode graph reads are set (the sampling settings stay the plan's)."""
    request_of_token = np.repeat(np.arange(plan.num_reqs), np.diff(plan.query_start))
    num_tokens = plan.num_tokens
    return StepPlan(
        step_id=plan.step_id, replica=plan.replica,
        query_start=np.arange(num_tokens + 1, dtype=np.int32),
        seq_lens=(plan.positions + 1).astype(np.int32),
        block_table=plan.block_table[request_of_token],
        logits_index=np.arange(num_tokens, dtype=np.int32),
        input_ids=plan.input_ids, positions=plan.positions, kv_index=plan.kv_index,
    )


def extra_kv_reads(plan: StepPlan) -> int:
    """Token-reads of K/V that the step's rows make beyond one read of each request's context: 0 for
    a pure decode, n(n-1)/2 + (n-1)c for a chunk of n tokens after c cached ones."""
    return int((plan.positions.astype(np.int64) + 1).sum() - plan.seq_lens.astype(np.int64).sum())
