"""Prompt logprobs: the logprob of each prompt token under the model, from the logits of the token
before it, for the requests of a step whose plan asks (`StepPlan.num_prompt_logprobs` >= 0).

Within a chunk, token row j scores the input token at row j + 1; the chunk's last row scores
`next_prompt_id` when the chunk ends mid-prompt (the scheduler puts the next prompt token there) and
nothing otherwise (its logits sample the first output token). The rows go through the LM head and a
log-softmax in slices of SLICE_ROWS, so a long prompt never holds a [T, vocab] float32 block at once
(256 rows of a 152k vocabulary: 156 MB). A step whose plan asks for nothing does no extra work.
The LM head is collective under TP: every rank runs the same slices, rank 0 gets the scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from core.execution.host_to_device import to_device
from core.plan import StepPlan

SLICE_ROWS = 256


@dataclass(frozen=True)
class PromptTargets:
    """Which token rows of a step are scored, against which token, and how many per request."""

    token_rows: np.ndarray  # int64 [P] rows of the step's hidden states
    target_ids: np.ndarray  # int64 [P] the prompt token each row scores
    start: np.ndarray  # int32 [B + 1] prefix sum of the scored rows per request
    num_top: int  # the largest top-N any request asked for (0: the tokens' own logprobs only)


def prompt_targets(plan: StepPlan) -> PromptTargets | None:
    """The rows the plan asks to score, or None when it asks for none (host-side, no device sync)."""
    asked = plan.num_prompt_logprobs >= 0
    if not asked.any():
        return None
    query_start = plan.query_start.astype(np.int64)
    rows_of, targets_of = [], []
    counts = np.zeros(plan.num_reqs, np.int32)
    for r in np.flatnonzero(asked).tolist():
        first, last = int(query_start[r]), int(query_start[r + 1])
        rows = np.arange(first, last - 1, dtype=np.int64)
        targets = plan.input_ids[first + 1 : last].astype(np.int64)
        if plan.next_prompt_id[r] >= 0:
            rows = np.append(rows, last - 1)
            targets = np.append(targets, int(plan.next_prompt_id[r]))
        rows_of.append(rows)
        targets_of.append(targets)
        counts[r] = len(rows)
    start = np.zeros(plan.num_reqs + 1, np.int32)
    np.cumsum(counts, out=start[1:])
    if not start[-1]:
        return None  # only chunks of one token that end the prompt: nothing to score
    return PromptTargets(np.concatenate(rows_of), np.concatenate(targets_of), start,
                         int(plan.num_prompt_logprobs.max()))


@dataclass(frozen=True)
class PromptScores:
    """On rank 0, the scores of a step's PromptTargets, on the device (None on the other ranks)."""

    start: np.ndarray  # int32 [B + 1], as PromptTargets.start
    logprobs: torch.Tensor | None  # float32 [P]
    ranks: torch.Tensor | None  # int32 [P] 1 + how many tokens are likelier than the prompt's
    top_ids: torch.Tensor | None  # int32 [P, N]
    top_logprobs: torch.Tensor | None  # float32 [P, N]


def score_prompt(hidden: torch.Tensor, targets: PromptTargets,
                 compute_logits: Callable[[torch.Tensor], torch.Tensor | None]) -> PromptScores:
    """Score the target rows of `hidden` [T, hidden] slice by slice with the model's LM head."""
    device = hidden.device
    token_rows = to_device(targets.token_rows, device)
    target_ids = to_device(targets.target_ids, device)
    own, ranks, top_ids, top_values = [], [], [], []
    for first in range(0, len(token_rows), SLICE_ROWS):
        logits = compute_logits(hidden[token_rows[first : first + SLICE_ROWS]])
        if logits is None:  # a TP rank other than 0: it took part in the gather, rank 0 scores
            continue
        logprobs = torch.log_softmax(logits, dim=-1)
        scored = logprobs.gather(-1, target_ids[first : first + SLICE_ROWS, None])
        own.append(scored.squeeze(-1))
        ranks.append(((logprobs > scored).sum(-1) + 1).to(torch.int32))
        if targets.num_top > 0:
            values, ids = logprobs.topk(min(targets.num_top, logprobs.shape[1]), dim=-1)
            top_ids.append(ids.to(torch.int32))
            top_values.append(values)
    if not own:
        return PromptScores(targets.start, None, None, None, None)
    num = len(token_rows)
    if targets.num_top > 0:
        ids, values = torch.cat(top_ids), torch.cat(top_values)
    else:
        ids = torch.zeros((num, 0), dtype=torch.int32, device=device)
        values = torch.zeros((num, 0), dtype=torch.float32, device=device)
    return PromptScores(targets.start, torch.cat(own), torch.cat(ranks), ids, values)
