"""The contract between the scheduler and the executors: StepPlan in, StepResult out.

A StepPlan is a small header plus flat numpy arrays. There are no prefill and decode phases: each
scheduled request computes its next chunk of tokens (a decode is a chunk of one), so chunked
prefill, prefix-cache hits and mixed batches all take the same path. Each array field declares its
dtype and its length (`column`); `plan_arrays()` lists them, and ipc/plan_layout.py lays them out in
a shared-memory slot from that list. A field declared with a neutral value may be left out when a
plan is built (warm-up steps, tests, benchmarks): it is then filled with that value.

Every value travels in every plan: the executor keeps nothing per request between steps (only the
previous step's sampled tokens, which `prev_row` refers to, and a memo of structured outputs'
states that the plan's spec and history rebuild).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from core.sampling_params import DEFAULT_SAMPLING_ROW, SAMPLING_DTYPE

# An array's length: B requests, B+1 (prefix sums), BW (B rows of W pages), T tokens, H history ids,
# L logit-bias entries, G bytes of structured-output specs.
DIMS = ("B", "B+1", "BW", "T", "H", "L", "G")


def column(dtype, dim: str, neutral=None):
    """A StepPlan array field of `dtype` and length `dim` (one of DIMS). With a `neutral` value the
    field may be left out: a B or B+1 field is then filled with it, an H, L or G field is empty."""
    assert dim in DIMS, dim
    metadata = {"dtype": np.dtype(dtype), "dim": dim, "neutral": neutral}
    if neutral is None:
        return field(metadata=metadata)
    assert dim in ("B", "B+1", "H", "L", "G"), \
        f"a {dim} field has no length to fill without the plan's tokens"
    return field(metadata=metadata, default=None)


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    step_id: int
    replica: int
    # --- per request (B) ------------------------------------------------------------------------
    query_start: np.ndarray = column(np.int32, "B+1")  # prefix sum of this step's tokens per request
    seq_lens: np.ndarray = column(np.int32, "B")  # context length after this step
    block_table: np.ndarray = column(np.int32, "BW")  # pages of each request, W = widest request this step
    logits_index: np.ndarray = column(np.int32, "B")  # token row that yields the next token; -1 = mid-prefill
    # sampling settings, one record per request: the columns of core/sampling_params.py's table
    sampling: np.ndarray = column(SAMPLING_DTYPE, "B", neutral=DEFAULT_SAMPLING_ROW)
    output_pos: np.ndarray = column(np.int32, "B", neutral=0)  # tokens generated so far: noise index
    # token history, only for requests that sample with penalties (ragged: prompt then output) or with
    # only a structured output (its output: history_prompt_len 0)
    history_start: np.ndarray = column(np.int32, "B+1", neutral=0)
    history_prompt_len: np.ndarray = column(np.int32, "B", neutral=0)  # how many history ids are prompt
    history_ids: np.ndarray = column(np.int32, "H", neutral=0)
    # logit bias, only for requests that sample with one (ragged: request r's entries are
    # bias_start[r]:bias_start[r + 1])
    bias_start: np.ndarray = column(np.int32, "B+1", neutral=0)
    bias_ids: np.ndarray = column(np.int32, "L", neutral=0)
    bias_values: np.ndarray = column(np.float32, "L", neutral=0)
    # structured outputs, only for requests that sample with one: request r's spec (the UTF-8 JSON of
    # core/structured/grammar.py) is grammar_spec[grammar_start[r]:grammar_start[r + 1]]; its output
    # so far is the output part of its history, which such a request always carries
    grammar_start: np.ndarray = column(np.int32, "B+1", neutral=0)
    grammar_spec: np.ndarray = column(np.uint8, "G", neutral=0)
    # --- per token (T) --------------------------------------------------------------------------
    input_ids: np.ndarray = column(np.int32, "T")
    positions: np.ndarray = column(np.int32, "T")  # absolute position in the sequence
    kv_index: np.ndarray = column(np.int64, "T")  # page * block_size + offset where the token's K/V goes
    # --- per request, async scheduling ----------------------------------------------------------------
    # >= 0 where a request's one input token is the token sampled at that row of the replica's
    # previous step, not yet known to the scheduler (input_ids holds 0 there); -1 elsewhere.
    prev_row: np.ndarray = column(np.int32, "B", neutral=-1)
    # --- per request, prompt logprobs -----------------------------------------------------------------
    # >= 0 where the executor scores the chunk's prompt tokens: each token row's logits give the
    # logprob of the next prompt token (and this many top ones); -1 elsewhere (nothing computed).
    num_prompt_logprobs: np.ndarray = column(np.int32, "B", neutral=-1)
    # The prompt token after a chunk that ends mid-prompt, which its last row scores; -1 elsewhere.
    next_prompt_id: np.ndarray = column(np.int32, "B", neutral=-1)

    def __post_init__(self) -> None:
        lengths = {"B": len(self.seq_lens), "B+1": len(self.seq_lens) + 1, "H": 0, "L": 0, "G": 0}
        for name, dtype, dim, neutral in _NEUTRAL_FIELDS:
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.full(lengths[dim], neutral, dtype))

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
    # Present when some request of the plan scored prompt tokens (ragged: request r's scores are
    # entries prompt_logprob_start[r]:prompt_logprob_start[r + 1], for the chunk's positions
    # start + 1, start + 2, ... in order); the top ones are as wide as the step's largest ask.
    prompt_logprob_start: np.ndarray | None = None  # int32 [B + 1]
    prompt_logprobs: np.ndarray | None = None  # float32 [P]
    prompt_ranks: np.ndarray | None = None  # int32 [P] 1 + how many tokens were likelier
    prompt_top_ids: np.ndarray | None = None  # int32 [P, N]
    prompt_top_logprobs: np.ndarray | None = None  # float32 [P, N]
    error: str | None = None  # an exception inside the step, with the rank that raised it
    timings_ms: dict[str, float] = field(default_factory=dict)


def plan_arrays() -> tuple[tuple[str, np.dtype, str], ...]:
    """(name, dtype, dim) of every array of a StepPlan, in field order."""
    return tuple((f.name, f.metadata["dtype"], f.metadata["dim"]) for f in fields(StepPlan) if f.metadata)


# (name, dtype, dim, neutral) of the arrays a plan may be built without.
_NEUTRAL_FIELDS = tuple((f.name, f.metadata["dtype"], f.metadata["dim"], f.metadata["neutral"])
                        for f in fields(StepPlan) if f.metadata and f.metadata["neutral"] is not None)
