"""The contract between the scheduler and the executors: StepPlan in, StepResult out.

A StepPlan is a small header plus flat numpy arrays. There are no prefill and decode phases: each
scheduled request computes its next chunk of tokens (a decode is a chunk of one), so chunked
prefill, prefix-cache hits and mixed batches all take the same path. `pack_plan` lays the arrays out
contiguously in any writable buffer (a shared-memory slot) and `unpack_plan` reads them back as
zero-copy views.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields

import numpy as np

# Alignment of every array inside a packed plan, so views are aligned for any dtype and DMA.
_ALIGN = 64
_HEADER_WORDS = 8  # step_id, replica, B, T, W, H, then two spare words


@dataclass(frozen=True)
class StepPlan:
    step_id: int
    replica: int
    # --- per request (B) ------------------------------------------------------------------------
    req_slot: np.ndarray  # int32 [B]  executor-side persistent slot of the request
    query_start: np.ndarray  # int32 [B+1]  prefix sum of this step's tokens per request
    seq_lens: np.ndarray  # int32 [B]  context length after this step
    block_table: np.ndarray  # int32 [B, W]  pages of each request, W = widest request this step
    logits_index: np.ndarray  # int32 [B]  token row that yields the next token; -1 = mid-prefill
    # sampling, one value per request
    temperature: np.ndarray  # float32 [B]  0 = greedy
    top_p: np.ndarray  # float32 [B]
    top_k: np.ndarray  # int32 [B]  0 = no limit
    min_p: np.ndarray  # float32 [B]
    seed: np.ndarray  # int64 [B]  every request has one (the scheduler draws it when unset)
    output_pos: np.ndarray  # int32 [B]  tokens generated so far: the noise index of this draw
    repetition_penalty: np.ndarray  # float32 [B]
    presence_penalty: np.ndarray  # float32 [B]
    frequency_penalty: np.ndarray  # float32 [B]
    num_logprobs: np.ndarray  # int32 [B]  -1 = none, 0 = sampled token only, N = also the top N
    # token history for penalties, only for requests that have one (ragged: prompt then output)
    history_start: np.ndarray  # int32 [B+1]
    history_prompt_len: np.ndarray  # int32 [B]  how many of a request's history ids are prompt
    history_ids: np.ndarray  # int32 [H]
    # --- per token (T) --------------------------------------------------------------------------
    input_ids: np.ndarray  # int32 [T]
    positions: np.ndarray  # int32 [T]  absolute position in the sequence
    slot_mapping: np.ndarray  # int64 [T]  page * block_size + offset where the token's K/V goes
    # --- per request, async scheduling ----------------------------------------------------------------
    # >= 0 where a request's one input token is the token sampled at that row of the replica's
    # previous step, not yet known to the scheduler (input_ids holds 0 there); -1 elsewhere.
    # None when building a plan: no placeholders.
    prev_row: np.ndarray = None  # int32 [B]

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
    sampled_token_ids: np.ndarray  # int32 [B]
    # Present when some request asked for logprobs (raw model distribution, before sampling knobs).
    sampled_logprobs: np.ndarray | None = None  # float32 [B]
    top_token_ids: np.ndarray | None = None  # int32 [B, N]
    top_logprobs: np.ndarray | None = None  # float32 [B, N]
    error: str | None = None  # an exception inside the step, with the rank that raised it
    timings_ms: dict[str, float] = field(default_factory=dict)


_PLAN_ARRAYS: tuple[tuple[str, np.dtype, str], ...] = (
    ("req_slot", np.dtype(np.int32), "B"),
    ("query_start", np.dtype(np.int32), "B+1"),
    ("seq_lens", np.dtype(np.int32), "B"),
    ("block_table", np.dtype(np.int32), "BW"),
    ("logits_index", np.dtype(np.int32), "B"),
    ("prev_row", np.dtype(np.int32), "B"),
    ("temperature", np.dtype(np.float32), "B"),
    ("top_p", np.dtype(np.float32), "B"),
    ("top_k", np.dtype(np.int32), "B"),
    ("min_p", np.dtype(np.float32), "B"),
    ("seed", np.dtype(np.int64), "B"),
    ("output_pos", np.dtype(np.int32), "B"),
    ("repetition_penalty", np.dtype(np.float32), "B"),
    ("presence_penalty", np.dtype(np.float32), "B"),
    ("frequency_penalty", np.dtype(np.float32), "B"),
    ("num_logprobs", np.dtype(np.int32), "B"),
    ("history_start", np.dtype(np.int32), "B+1"),
    ("history_prompt_len", np.dtype(np.int32), "B"),
    ("history_ids", np.dtype(np.int32), "H"),
    ("input_ids", np.dtype(np.int32), "T"),
    ("positions", np.dtype(np.int32), "T"),
    ("slot_mapping", np.dtype(np.int64), "T"),
)
assert {n for n, _, _ in _PLAN_ARRAYS} == {f.name for f in fields(StepPlan)} - {"step_id", "replica"}


def _shape(kind: str, b: int, t: int, w: int, h: int) -> tuple[int, ...]:
    return {"B": (b,), "B+1": (b + 1,), "BW": (b, w), "T": (t,), "H": (h,)}[kind]


@functools.lru_cache(maxsize=1024)  # decode steps repeat a handful of shapes
def _layout(b: int, t: int, w: int, h: int) -> tuple[list[tuple[str, np.dtype, tuple, int, int]], int]:
    """(name, dtype, shape, byte offset, element count) of every array, and the total bytes."""
    offset = _HEADER_WORDS * 8
    layout = []
    for name, dtype, kind in _PLAN_ARRAYS:
        offset = -(-offset // _ALIGN) * _ALIGN
        shape = _shape(kind, b, t, w, h)
        count = math.prod(shape)
        layout.append((name, dtype, shape, offset, count))
        offset += count * dtype.itemsize
    return layout, offset


def packed_plan_nbytes(num_reqs: int, num_tokens: int, width: int, num_history: int) -> int:
    return _layout(num_reqs, num_tokens, width, num_history)[1]


def pack_plan(plan: StepPlan, buffer: memoryview | np.ndarray) -> int:
    """Write `plan` into `buffer` (a shared-memory slot, say); returns the bytes used."""
    b, t = plan.num_reqs, plan.num_tokens
    w, h = plan.block_table.shape[1], len(plan.history_ids)
    layout, nbytes = _layout(b, t, w, h)
    out = np.frombuffer(buffer, dtype=np.uint8)
    if nbytes > out.nbytes:
        raise ValueError(f"step {plan.step_id} needs {nbytes} bytes, the slot holds {out.nbytes}")
    out[: _HEADER_WORDS * 8].view(np.int64)[:6] = (plan.step_id, plan.replica, b, t, w, h)
    for name, dtype, shape, offset, count in layout:
        if count:
            np.frombuffer(buffer, dtype, count, offset).reshape(shape)[...] = getattr(plan, name)
    return nbytes


def unpack_plan(buffer: memoryview | np.ndarray) -> StepPlan:
    """Read a packed plan back; the arrays are views into `buffer`, not copies."""
    raw = np.frombuffer(buffer, dtype=np.uint8)
    step_id, replica, b, t, w, h = (int(x) for x in raw[: _HEADER_WORDS * 8].view(np.int64)[:6])
    arrays = {name: np.frombuffer(buffer, dtype, count, offset).reshape(shape) if count
              else np.zeros(shape, dtype) for name, dtype, shape, offset, count in _layout(b, t, w, h)[0]}
    return StepPlan(step_id=step_id, replica=replica, **arrays)


def packed_plan_header(buffer: memoryview | np.ndarray) -> tuple[int, int]:
    """(step_id, replica) of a packed plan, without reading the rest."""
    words = np.frombuffer(buffer, dtype=np.uint8)[:16].view(np.int64)
    return int(words[0]), int(words[1])
