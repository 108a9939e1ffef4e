"""One request's prompt logprobs as the steps score them, and the plan columns that ask for them.

A request with `prompt_logprobs` set has each prompt token scored by the executor, chunk by chunk
(core/execution/prompt_logprobs.py): the logprob of prompt token p comes from the logits of token
p - 1, so the first token has none. The scores are kept by prompt position, so a chunk recomputed
after a preemption overwrites rather than duplicates, and go out once, with the request's first
TokenDelta. Such a request reuses no prefix-cache pages (a cached token is never computed, so it
could not be scored), as in vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from core.plan import StepResult


class PromptLogprobs:
    """The scores of one request's prompt tokens, by position, until they are delivered."""

    def __init__(self, prompt_token_ids: np.ndarray, num_top: int) -> None:
        self.prompt_token_ids = prompt_token_ids  # a view of the request's prompt
        self.num_top = num_top
        self.logprobs = np.full(len(prompt_token_ids), np.nan, np.float32)  # position 0 stays NaN
        self.ranks = np.zeros(len(prompt_token_ids), np.int32)
        self.top_ids = np.zeros((len(prompt_token_ids), num_top), np.int32)
        self.top_logprobs = np.zeros((len(prompt_token_ids), num_top), np.float32)
        self.delivered = False

    def wanted_from(self, start: int) -> bool:
        """Whether a chunk that starts at position `start` has prompt tokens to score."""
        return not self.delivered and start < len(self.prompt_token_ids) - 1

    def record(self, start: int, result: StepResult, row: int) -> None:
        """Keep the scores row `row` of a step got for its chunk from position `start`: entry k is
        prompt position start + 1 + k; positions past the prompt (a recomputed output) are dropped."""
        first, last = result.prompt_logprob_start[row], result.prompt_logprob_start[row + 1]
        count = min(int(last - first), len(self.prompt_token_ids) - 1 - start)
        if count <= 0:
            return
        at = slice(start + 1, start + 1 + count)
        self.logprobs[at] = result.prompt_logprobs[first : first + count]
        self.ranks[at] = result.prompt_ranks[first : first + count]
        width = min(self.num_top, result.prompt_top_ids.shape[1])
        self.top_ids[at, :width] = result.prompt_top_ids[first : first + count, :width]
        self.top_logprobs[at, :width] = result.prompt_top_logprobs[first : first + count, :width]

    def deliver(self) -> tuple[list[float | None], list[int | None], list[list[tuple[int, float]]]]:
        """Per prompt token, its logprob and rank (None for the first) and its top (token id,
        logprob) pairs."""
        self.delivered = True
        logprobs: list[float | None] = self.logprobs.tolist()
        ranks: list[int | None] = self.ranks.tolist()
        logprobs[0] = ranks[0] = None
        ids, values = self.top_ids.tolist(), self.top_logprobs.tolist()
        top = [[] if p == 0 else list(zip(ids[p], values[p])) for p in range(len(ids))]
        return logprobs, ranks, top


def prompt_columns(chunks: Sequence, seq_lens: np.ndarray) -> dict[str, np.ndarray]:
    """The plan's num_prompt_logprobs and next_prompt_id for the step's chunks (ScheduledChunks):
    empty when no request of the step scores its prompt (the plan then fills the neutral -1)."""
    asking = [row for row, c in enumerate(chunks)
              if c.request.prompt_scores is not None and c.request.prompt_scores.wanted_from(c.start)]
    if not asking:
        return {}
    num_prompt_logprobs = np.full(len(chunks), -1, np.int32)
    next_prompt_id = np.full(len(chunks), -1, np.int32)
    for row in asking:
        scores = chunks[row].request.prompt_scores
        num_prompt_logprobs[row] = scores.num_top
        if seq_lens[row] < len(scores.prompt_token_ids):
            next_prompt_id[row] = scores.prompt_token_ids[seq_lens[row]]
    return {"num_prompt_logprobs": num_prompt_logprobs, "next_prompt_id": next_prompt_id}
