"""A StepPlan's bytes in a shared-memory ring slot: the layout both sides of the ring agree on.

    [0, 64)        header: step_id, replica, B, T, W, H, L, G as int64
    then           every array of the plan in StepPlan's field order, each 64-byte aligned
                   (`sampling` is one array of records, SAMPLING_DTYPE of core/sampling_params.py)

B requests, T tokens, W pages in the widest block-table row, H history ids, L logit-bias entries,
G bytes of structured-output specs. `pack_plan`
writes a plan into any writable buffer; `unpack_plan` reads it back as zero-copy views.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from core.plan import StepPlan, plan_arrays

# Alignment of every array inside a packed plan, so views are aligned for any dtype and DMA.
ALIGN = 64
_HEADER_WORDS = 8  # step_id, replica, B, T, W, H, L, G
_PLAN_ARRAYS = plan_arrays()


def _shape(kind: str, b: int, t: int, w: int, h: int, bias: int, g: int) -> tuple[int, ...]:
    return {"B": (b,), "B+1": (b + 1,), "BW": (b, w), "T": (t,), "H": (h,), "L": (bias,), "G": (g,)}[kind]


@functools.lru_cache(maxsize=1024)  # decode steps repeat a handful of shapes
def _layout(b: int, t: int, w: int, h: int, bias: int,
            g: int) -> tuple[list[tuple[str, np.dtype, tuple, int, int]], int]:
    """(name, dtype, shape, byte offset, element count) of every array, and the total bytes."""
    offset = _HEADER_WORDS * 8
    layout = []
    for name, dtype, kind in _PLAN_ARRAYS:
        offset = -(-offset // ALIGN) * ALIGN
        shape = _shape(kind, b, t, w, h, bias, g)
        count = math.prod(shape)
        layout.append((name, dtype, shape, offset, count))
        offset += count * dtype.itemsize
    return layout, offset


def packed_plan_nbytes(num_reqs: int, num_tokens: int, width: int, num_history: int,
                       num_bias: int = 0, num_grammar: int = 0) -> int:
    return _layout(num_reqs, num_tokens, width, num_history, num_bias, num_grammar)[1]


def plan_nbytes(plan: StepPlan) -> int:
    """The bytes `pack_plan` writes for `plan`."""
    return _layout(*_dims(plan))[1]


def _dims(plan: StepPlan) -> tuple[int, int, int, int, int, int]:
    """B, T, W, H, L, G of a plan."""
    return (plan.num_reqs, plan.num_tokens, plan.block_table.shape[1], len(plan.history_ids),
            len(plan.bias_ids), len(plan.grammar_spec))


def pack_plan(plan: StepPlan, buffer: memoryview | np.ndarray) -> int:
    """Write `plan` into `buffer` (a shared-memory slot, say); returns the bytes used."""
    dims = _dims(plan)
    layout, nbytes = _layout(*dims)
    out = np.frombuffer(buffer, dtype=np.uint8)
    if nbytes > out.nbytes:
        raise ValueError(f"step {plan.step_id} needs {nbytes} bytes, the slot holds {out.nbytes}")
    out[: _HEADER_WORDS * 8].view(np.int64)[:8] = (plan.step_id, plan.replica, *dims)
    for name, dtype, shape, offset, count in layout:
        if count:
            np.frombuffer(buffer, dtype, count, offset).reshape(shape)[...] = getattr(plan, name)
    return nbytes


def unpack_plan(buffer: memoryview | np.ndarray) -> StepPlan:
    """Read a packed plan back; the arrays are views into `buffer`, not copies."""
    raw = np.frombuffer(buffer, dtype=np.uint8)
    step_id, replica, *dims = (int(x) for x in raw[: _HEADER_WORDS * 8].view(np.int64)[:8])
    arrays = {name: np.frombuffer(buffer, dtype, count, offset).reshape(shape) if count
              else np.zeros(shape, dtype) for name, dtype, shape, offset, count in _layout(*dims)[0]}
    return StepPlan(step_id=step_id, replica=replica, **arrays)


def packed_plan_header(buffer: memoryview | np.ndarray) -> tuple[int, int]:
    """(step_id, replica) of a packed plan, without reading the rest."""
    words = np.frombuffer(buffer, dtype=np.uint8)[:16].view(np.int64)
    return int(words[0]), int(words[1])
