"""The contract between the scheduler and the executors: StepPlan in, StepResult out.

A StepPlan is a small header plus flat numpy arrays. There are no prefill and decode phases: each
scheduled request computes its next chunk of tokens (a decode is a chunk of one), so chunked
prefill, prefix-cache hits and mixed batches all take the same path. Each array field declares its
dtype and its length (`column`); `plan_arrays()` lists them, and ipc/plan_layout.py lays them out in
a shared-memory slot from that list.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

# An array's length: B requests, B+1 (prefix sums), BW (B rows of W pages), T tokens, H history ids.
DIMS = ("B", "B+1", "BW", "T", "H")


def column(dtype, dim: str, **kwargs):
    """A StepPlan array field of `dtype` and length `dim` (one of DIMS)."""
    assert dim in DIMS, dim
    return field(metadata={"dtype": np.dtype(dtype), "dim": dim}, **kwargs)


@dataclass(frozen=True)
class StepPlan:
    step_id: int
    replica: int
    # --- per request (B) ------------------------------------------------------------------------
    req_slot: np.ndarray = column(np.int32, "B")  # executor-side persistent slot of the request
    query_start: np.ndarray = column(np.int32, "B+1")  # prefix sum of this step's tokens per request
    seq_lens: np.ndarray = column(np.int32, "B")  # context length after this step
    block_table: np.ndarray = column(np.int32, "BW")  # pages of each request, W = widest request this step
    logits_index: np.ndarray = column(np.int32, "B")  # token row that yields the next token; -1 = mid-prefill
    # sampling, one value per request
    temperature: np.ndarray = column(np.float32, "B")  # 0 = greedy
    top_p: np.ndarray = column(np.float32, "B")
    top_k: np.ndarray = column(np.int32, "B")  # 0 = no limit
    min_p: np.ndarray = column(np.float32, "B")
    seed: np.ndarray = column(np.int64, "B")  # every request has one (the scheduler draws it when unset)
    output_pos: np.ndarray = column(np.int32, "B")  # tokens generated so far: the noise index of this draw
    repetition_penalty: np.ndarray = column(np.float32, "B")
    presence_penalty: np.ndarray = column(np.float32, "B")
    frequency_penalty: np.ndarray = column(np.float32, "B")
    num_logprobs: np.ndarray = column(np.int32, "B")  # -1 = none, 0 = sampled token only, N = also the top N
    # token history for penalties, only for requests that have one (ragged: prompt then output)
    history_start: np.ndarray = column(np.int32, "B+1")
    history_prompt_len: np.ndarray = column(np.int32, "B")  # how many of a request's history ids are prompt
    history_ids: np.ndarray = column(np.int32, "H")
    # --- per token (T) --------------------------------------------------------------------------
    input_ids: np.ndarray = column(np.int32, "T")
    positions: np.ndarray = column(np.int32, "T")  # absolute position in the sequence
    slot_mapping: np.ndarray = column(np.int64, "T")  # page * block_size + offset where the token's K/V goes
    # --- per request, async scheduling ----------------------------------------------------------------
    # >= 0 where a request's one input token is the token sampled at that row of the replica's
    # previous step, not yet known to the scheduler (input_ids holds 0 there); -1 elsewhere.
    # None when building a plan: no placeholders.
    prev_row: np.ndarray = column(np.int32, "B", default=None)

    def __post_init__(self) -> None:
        if self.prev_row is None:
            object.__setattr__(self, "prev_row", np.full(len(self.seq_lens), -1, np.int32))

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def placeholder_rows(self) -> np.ndarray:
        """Indices of the requests whose input token the executor fills from the previous step."""
        return np.flatnonzero(self.prev_row >= 0)

    @property
    def sampled_rows(self) -> np.ndarray:
        """Indices of the requests that sample a token this step."""
        return np.flatnonzero(self.logits_index >= 0)


@dataclass(frozen=True)
class StepResult:
    step_id: int
    replica: int
    # One entry per request of the plan; rows whose logits_index was -1 hold 0 and mean nothing.
    sampled_token_ids: np.ndarray = column(np.int32, "B")
    # Present when some request asked for logprobs (raw model distribution, before sampling knobs).
    sampled_logprobs: np.ndarray | None = None  # float32 [B]
    top_token_ids: np.ndarray | None = None  # int32 [B, N]
    top_logprobs: np.ndarray | None = None  # float32 [B, N]
    error: str | None = None  # an exception inside the step, with the rank that raised it
    timings_ms: dict[str, float] = field(default_factory=dict)


def plan_arrays() -> tuple[tuple[str, np.dtype, str], ...]:
    """(name, dtype, dim) of every array of a StepPlan, in field order."""
    return tuple((f.name, f.metadata["dtype"], f.metadata["dim"]) for f in fields(StepPlan) if f.metadata)
