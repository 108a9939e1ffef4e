"""Hand-built StepPlans for tests of the runner and the model, without a scheduler."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.plan import StepPlan
from core.sampling_params import sampling_rows


@dataclass
class Chunk:
    """One request's part of a step: `token_ids` computed at positions start .. start + n - 1."""

    token_ids: list[int]
    start: int
    pages: list[int]
    sample: bool = True
    temperature: float = 0.0
    seed: int = 0
    output_pos: int = 0
    num_logprobs: int = -1


def make_plan(chunks: list[Chunk], block_size: int, step_id: int = 0) -> StepPlan:
    num_reqs = len(chunks)
    lens = [len(c.token_ids) for c in chunks]
    query_start = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    width = max(len(c.pages) for c in chunks)
    block_table = np.zeros((num_reqs, width), np.int32)
    positions, slots = [], []
    for i, c in enumerate(chunks):
        block_table[i, : len(c.pages)] = c.pages
        pos = np.arange(c.start, c.start + len(c.token_ids))
        assert (pos // block_size).max() < len(c.pages), "chunk runs past its pages"
        positions.append(pos)
        slots.append(np.asarray(c.pages)[pos // block_size] * block_size + pos % block_size)

    return StepPlan(
        step_id=step_id, replica=0, query_start=query_start,
        seq_lens=np.asarray([c.start + len(c.token_ids) for c in chunks], np.int32),
        block_table=block_table,
        logits_index=np.asarray([query_start[i + 1] - 1 if c.sample else -1 for i, c in enumerate(chunks)],
                                np.int32),
        sampling=sampling_rows(num_reqs, temperature=[c.temperature for c in chunks],
                               seed=[c.seed for c in chunks], num_logprobs=[c.num_logprobs for c in chunks]),
        output_pos=np.asarray([c.output_pos for c in chunks], np.int32),
        input_ids=np.concatenate([np.asarray(c.token_ids, np.int32) for c in chunks]),
        positions=np.concatenate(positions).astype(np.int32),
        kv_index=np.concatenate(slots).astype(np.int64),
    )
