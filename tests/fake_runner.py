"""FakeRunner: a stand-in for the executors that checks every StepPlan and computes from the KV it reads.

The fake model writes, for every input token, a value derived from (token id, position) into the
KV slot the plan names, and a sampled token is a hash of the values it reads back through the
block table over the whole context. So the tokens come out right only if the scheduler's pages hold
exactly the request's own tokens: a wrongly shared, overwritten or stale page changes the output.
`reference_tokens` generates the same tokens from the token sequence alone, with no pages at all;
scheduler tests compare against it.
"""

from __future__ import annotations

import numpy as np

from core.plan import StepPlan, StepResult
from core.sampling_params import SAMPLING_DTYPE, SamplingParams

_NOT_WRITTEN = -1
_MASK64 = (1 << 64) - 1


def kv_value(token_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """What the fake model writes in a token's KV slot."""
    return (np.asarray(token_ids, np.int64) * 1_000_003 + np.asarray(positions, np.int64) * 7_919 + 17) % (
        2**31 - 1)


def next_token(context_sum: int, seed: int, output_pos: int, greedy: bool, vocab_size: int) -> int:
    """The fake model's next token: a hash of its context's KV values (and seed, position when sampling)."""
    h = context_sum & _MASK64
    if not greedy:
        h = (h * 6364136223846793005 + (seed & _MASK64) * 1442695040888963407 + output_pos) & _MASK64
    h ^= h >> 31
    h = (h * 0x9E3779B97F4A7C15) & _MASK64
    h ^= h >> 29
    return h % vocab_size


def reference_tokens(prompt: list[int] | np.ndarray, params: SamplingParams, seed: int,
                     eos_token_ids: tuple[int, ...], max_model_len: int, vocab_size: int) -> list[int]:
    """The tokens a request must get, generated one by one from its token sequence (the spec)."""
    tokens = [int(t) for t in prompt]
    context_sum = int(kv_value(tokens, np.arange(len(tokens))).sum())
    output: list[int] = []
    while True:
        token = next_token(context_sum, seed, len(output), params.temperature == 0.0, vocab_size)
        output.append(token)
        tokens.append(token)
        if len(output) >= params.min_tokens and (
                (token in eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids):
            return output
        if len(output) >= params.max_tokens or len(tokens) >= max_model_len:
            return output
        context_sum += int(kv_value([token], [len(tokens) - 1])[0])


class FakeRunner:
    def __init__(self, num_pages: int, block_size: int, vocab_size: int = 1000,
                 fail_at_step: int | None = None) -> None:
        self.num_pages = num_pages
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.fail_at_step = fail_at_step
        self.kv = np.full(num_pages * block_size, _NOT_WRITTEN, np.int64)  # one value per KV slot
        self.plans: list[StepPlan] = []
        self.last_sampled: np.ndarray | None = None  # of the previous step, for placeholder inputs
        self.last_step_id = -1

    def run(self, plan: StepPlan) -> StepResult:
        check_plan(plan, self.block_size, self.num_pages)
        self.plans.append(plan)
        if plan.step_id == self.fail_at_step:
            self.last_sampled, self.last_step_id = np.zeros(plan.num_reqs, np.int32), plan.step_id
            return StepResult(plan.step_id, plan.replica, np.zeros(plan.num_reqs, np.int32),
                              error="executor dp=0 tp=0: CUDA error: an illegal memory access")
        # Like the executor: a placeholder input is the token sampled at that row of the previous step.
        input_ids = plan.input_ids.copy()
        rows = plan.placeholder_rows
        if len(rows):
            assert self.last_sampled is not None, f"step {plan.step_id} has placeholders, no step ran before"
            assert plan.step_id == self.last_step_id + 1, "placeholders must refer to the step just before"
            input_ids[plan.query_start[rows]] = self.last_sampled[plan.prev_row[rows]]
        # Like attention kernels: every new token's KV is written before anything is read.
        self.kv[plan.kv_index] = kv_value(input_ids, plan.positions)
        sampled = np.zeros(plan.num_reqs, np.int32)
        for row in plan.sampled_rows.tolist():
            positions = np.arange(plan.seq_lens[row])
            slots = plan.block_table[row, positions // self.block_size].astype(np.int64) * self.block_size
            values = self.kv[slots + positions % self.block_size]
            assert (values != _NOT_WRITTEN).all(), f"step {plan.step_id} row {row} reads KV never written"
            settings = plan.sampling[row]
            sampled[row] = next_token(int(values.sum()), int(settings["seed"]), int(plan.output_pos[row]),
                                      bool(settings["temperature"] == 0.0), self.vocab_size)
        self.last_sampled, self.last_step_id = sampled, plan.step_id
        return StepResult(plan.step_id, plan.replica, sampled, **self._logprobs(plan, sampled))

    @staticmethod
    def _logprobs(plan: StepPlan, sampled: np.ndarray) -> dict[str, np.ndarray]:
        num_logprobs = plan.sampling["num_logprobs"]
        if not (num_logprobs >= 0).any():
            return {}
        width = max(int(num_logprobs.max()), 1)
        top_ids = (sampled[:, None] + np.arange(width)[None, :]).astype(np.int32)
        top_logprobs = -np.broadcast_to(np.arange(width, dtype=np.float32), top_ids.shape).copy()
        return {"sampled_logprobs": -(sampled % 7).astype(np.float32) / 8, "top_token_ids": top_ids,
                "top_logprobs": top_logprobs}


def check_plan(plan: StepPlan, block_size: int, num_pages: int) -> None:
    """The contract of core/plan.py, checked from the plan alone."""
    b, t = plan.num_reqs, plan.num_tokens
    for name in ("seq_lens", "logits_index", "sampling", "output_pos", "history_prompt_len", "prev_row"):
        assert getattr(plan, name).shape == (b,), f"{name} has shape {getattr(plan, name).shape}, B = {b}"
    assert plan.sampling.dtype == SAMPLING_DTYPE, f"sampling has dtype {plan.sampling.dtype}"
    assert len(plan.positions) == len(plan.kv_index) == t
    qs = plan.query_start
    assert qs.shape == (b + 1,) and qs[0] == 0 and qs[-1] == t, f"query_start {qs} does not cover {t} tokens"
    num_new = np.diff(qs)
    assert (num_new >= 1).all(), f"step {plan.step_id}: a scheduled request computes no token"
    rows = np.repeat(np.arange(b), num_new)
    first_pos = plan.seq_lens - num_new
    assert (first_pos >= 0).all()
    expected_positions = first_pos[rows] + np.arange(t) - qs[:-1][rows]
    assert (plan.positions == expected_positions).all(), f"step {plan.step_id}: positions not contiguous"
    num_pages_of = -(-plan.seq_lens // block_size)
    assert plan.block_table.shape == (b, int(num_pages_of.max())), (
        f"block_table {plan.block_table.shape} is not as wide as the widest request {num_pages_of.max()}")
    in_use = np.arange(plan.block_table.shape[1])[None, :] < num_pages_of[:, None]
    assert (plan.block_table[~in_use] == 0).all(), "block_table is not padded with 0"
    used = plan.block_table[in_use]
    assert ((used >= 0) & (used < num_pages)).all(), f"block_table names a page outside 0..{num_pages - 1}"
    for row in range(b):
        row_pages = plan.block_table[row, : num_pages_of[row]]
        assert len(np.unique(row_pages)) == len(row_pages), f"row {row} names a page twice"
    pages = plan.block_table[rows, plan.positions // block_size].astype(np.int64)
    assert (plan.kv_index == pages * block_size + plan.positions % block_size).all(), (
        f"step {plan.step_id}: kv_index does not point into the request's own pages")
    assert len(np.unique(plan.kv_index)) == t, f"step {plan.step_id}: two tokens write one KV slot"
    # A page written this step belongs to one request: a page shared through the cache is read-only.
    page_ids, counts = np.unique(used, return_counts=True)
    shared = page_ids[counts > 1]
    written = np.unique(plan.kv_index // block_size)
    assert not np.isin(written, shared).any(), (
        f"step {plan.step_id} writes into shared pages {np.intersect1d(written, shared).tolist()}")
    last_rows = qs[1:] - 1
    assert ((plan.logits_index == -1) | (plan.logits_index == last_rows)).all(), (
        f"logits_index {plan.logits_index} is neither -1 nor a request's last row")
    placeholders = plan.placeholder_rows
    assert (num_new[placeholders] == 1).all(), f"step {plan.step_id}: a placeholder row is not a decode"
    assert (plan.input_ids[qs[placeholders]] == 0).all(), "a placeholder input is not 0"
    assert (plan.logits_index[placeholders] >= 0).all(), "a placeholder row samples nothing"
    hs = plan.history_start
    assert hs.shape == (b + 1,) and hs[0] == 0 and hs[-1] == len(plan.history_ids)
    assert (np.diff(hs) >= 0).all(), f"history_start {hs} decreases"
    for row in np.flatnonzero(np.diff(hs)).tolist():
        assert plan.logits_index[row] >= 0, f"row {row} has a history but samples nothing"
        if plan.history_prompt_len[row] == 0:  # a structured output's, without penalties: its output
            pending = int(plan.prev_row[row] >= 0)  # the token in flight is not in it yet
            assert hs[row + 1] - hs[row] == plan.output_pos[row] - pending, (
                f"row {row}: history is not the output")
            continue
        assert plan.history_ids[hs[row + 1] - 1] == plan.input_ids[plan.logits_index[row]], (
            f"row {row}: the history does not end with the last input token")
        assert hs[row + 1] - hs[row] == plan.seq_lens[row], f"row {row}: history is not the whole context"
