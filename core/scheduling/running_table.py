"""RunningTable: the running requests of one replica, one row each, and the StepPlan gathered from them.

A running request's block-table row and sampling settings are written into its row once (pages as
they are added), so building a step's plan is a fancy index per field plus per-token numpy
arithmetic: no Python loop per token, no copy per request. The rows are the scheduler's own
bookkeeping; the executor sees only the gathered ones. The scheduler decides who
runs; this module only lays the decision out as flat arrays.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from core.plan import StepPlan
from core.sampling_params import SAMPLING_DTYPE, sampling_row
from core.scheduling.prompt_logprobs import prompt_columns
from core.scheduling.request import Request


@dataclass(slots=True)
class ScheduledChunk:
    """One request's share of a step: `num_new` tokens from position `start` of its `total`."""

    request: Request
    num_new: int
    start: int  # tokens computed or in flight before this step
    total: int  # its tokens once every step in flight has sampled (known + pending)
    prev_row: int = -1  # its row in the previous step when its input is that step's sample
    epoch: int = 0  # request.num_preemptions when scheduled: a later preemption voids the chunk


class RunningTable:
    """Rows of the running requests and what the plan needs per row, kept as numpy arrays.

    A running request's block-table row and sampling settings are written once (pages as they
    are added), so a step gathers them with one fancy index instead of a copy per request.
    """

    def __init__(self, num_rows: int, max_pages_per_request: int, eos_token_ids: Iterable[int] = ()) -> None:
        self._free = list(range(num_rows - 1, -1, -1))  # pop() hands out row 0 first
        self.block_table = np.zeros((num_rows, max_pages_per_request), np.int32)  # 0 = padding
        self.sampling = np.zeros(num_rows, SAMPLING_DTYPE)  # one record of settings per row
        self.needs_history = np.zeros(num_rows, bool)  # penalties or a structured output
        self.has_penalties = np.zeros(num_rows, bool)  # the history includes the prompt
        self.num_scoring_prompts = 0  # running requests that asked for prompt logprobs
        self.logit_bias: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # row -> (ids, biases), if any
        self.structured: dict[int, np.ndarray] = {}  # row -> its structured-output spec (UTF-8), if any
        # row -> (min_tokens, the ids that would stop it): banned while fewer tokens are out, as vLLM does
        self.min_tokens: dict[int, tuple[int, np.ndarray]] = {}
        self._eos_token_ids = tuple(eos_token_ids)

    def assign(self, request: Request) -> None:
        row, params = self._free.pop(), request.sampling_params
        request.row = row
        self.sampling[row] = sampling_row(params, request.seed)
        self.needs_history[row] = params.needs_history
        self.has_penalties[row] = params.has_penalties
        self.num_scoring_prompts += request.prompt_scores is not None
        if params.logit_bias:
            ids, biases = zip(*params.logit_bias, strict=True)
            self.logit_bias[row] = (np.array(ids, np.int32), np.array(biases, np.float32))
        if params.structured_output:
            self.structured[row] = np.frombuffer(params.structured_output.encode(), np.uint8)
        elif params.min_tokens:  # a structured output ends where its form does (request_outcome.py)
            stops = {*params.stop_token_ids, *(() if params.ignore_eos else self._eos_token_ids)}
            if stops:
                self.min_tokens[row] = (params.min_tokens, np.array(sorted(stops), np.int32))

    def add_pages(self, request: Request, pages: list[int]) -> None:
        start = len(request.pages)
        self.block_table[request.row, start : start + len(pages)] = pages
        request.pages.extend(pages)

    def replace_page(self, request: Request, index: int, page: int) -> None:
        """Swap a request's page for another holding the same tokens (the prefix cache's copy)."""
        request.pages[index] = page
        self.block_table[request.row, index] = page

    def release(self, request: Request) -> None:
        self.block_table[request.row, : len(request.pages)] = 0
        self._free.append(request.row)
        self.num_scoring_prompts -= request.prompt_scores is not None
        self.logit_bias.pop(request.row, None)
        self.structured.pop(request.row, None)
        self.min_tokens.pop(request.row, None)
        request.row = None

    # --- the plan gathered from the table_rows ----------------------------------------------------------
    def build_plan(self, scheduled: list[ScheduledChunk], block_size: int, step_id: int,
                   replica: int) -> StepPlan:
        """Flat arrays of the step: per-request Python, per-token numpy."""
        num_reqs = len(scheduled)
        columns = np.array([(c.request.row, c.start, c.num_new, c.total, c.request.prompt_len,
                             c.request.last_token_id if c.prev_row < 0 else 0, c.prev_row)
                            for c in scheduled], np.int32).reshape(num_reqs, 7)
        table_rows, num_computed, num_new, num_tokens, prompt_len, last_token_ids, prev_row = columns.T
        query_start = np.zeros(num_reqs + 1, np.int32)
        np.cumsum(num_new, out=query_start[1:])
        num_step_tokens = int(query_start[-1])
        seq_lens = num_computed + num_new
        # A decode's input is its last token (0 for a placeholder the executor fills); only prefill
        # chunks copy a slice of their tokens, all of them known.
        input_ids = np.repeat(last_token_ids, num_new)
        for row in np.flatnonzero((num_new > 1) | (seq_lens < num_tokens)).tolist():
            request, start = scheduled[row].request, int(num_computed[row])
            input_ids[query_start[row] : query_start[row + 1]] = request.all_token_ids[start : seq_lens[row]]
        # positions: each request's run num_computed, num_computed + 1, ... laid end to end
        positions = (np.arange(num_step_tokens, dtype=np.int32)
                     + np.repeat(num_computed - query_start[:-1], num_new))
        width = -(-int(seq_lens.max()) // block_size)
        block_table = self.block_table[table_rows, :width]
        token_rows = np.repeat(np.arange(num_reqs), num_new)
        kv_index = (block_table[token_rows, positions // block_size].astype(np.int64) * block_size
                        + positions % block_size)
        logits_index = np.where(seq_lens == num_tokens, query_start[1:] - 1, -1).astype(np.int32)
        history = self._history(scheduled, table_rows, prompt_len, logits_index >= 0)
        return StepPlan(
            step_id=step_id, replica=replica, query_start=query_start,
            seq_lens=seq_lens, block_table=block_table, logits_index=logits_index,
            sampling=np.take(self.sampling, table_rows), output_pos=num_tokens - prompt_len,
            input_ids=input_ids, positions=positions, kv_index=kv_index, prev_row=prev_row, **history,
            **(prompt_columns(scheduled, seq_lens) if self.num_scoring_prompts else {}),
            **(self._logit_bias(table_rows, logits_index >= 0, num_tokens - prompt_len)
               if self.logit_bias or self.min_tokens else {}),
            **(self._structured(table_rows, logits_index >= 0) if self.structured else {}),
        )

    def _logit_bias(self, table_rows: np.ndarray, sampling: np.ndarray,
                    output_pos: np.ndarray) -> dict[str, np.ndarray]:
        """The logit bias of the requests that sample this step and have one (their own, and -inf on
        their stop tokens while min_tokens are not out yet); empty ranges for the others."""
        lengths = np.zeros(len(table_rows), np.int32)
        ids, biases = [], []
        candidates = np.fromiter((*self.logit_bias, *self.min_tokens), np.int32)
        for index in np.flatnonzero(sampling & np.isin(table_rows, candidates)).tolist():  # those rows only
            row = int(table_rows[index])
            entries = [self.logit_bias[row]] if row in self.logit_bias else []
            if row in self.min_tokens:
                least, stops = self.min_tokens[row]
                if output_pos[index] < least:
                    entries.append((stops, np.full(len(stops), -np.inf, np.float32)))
                elif output_pos[index] > least:  # out for good, even if the one in flight is voided
                    del self.min_tokens[row]
            for entry in entries:
                lengths[index] += len(entry[0])
                ids.append(entry[0])
                biases.append(entry[1])
        bias_start = np.zeros(len(table_rows) + 1, np.int32)
        np.cumsum(lengths, out=bias_start[1:])
        return {"bias_start": bias_start,
                "bias_ids": np.concatenate(ids) if ids else np.zeros(0, np.int32),
                "bias_values": np.concatenate(biases) if biases else np.zeros(0, np.float32)}

    def _structured(self, table_rows: np.ndarray, sampling: np.ndarray) -> dict[str, np.ndarray]:
        """The structured-output specs of the requests that sample this step with one."""
        lengths = np.zeros(len(table_rows), np.int32)
        specs = []
        rows_with_spec = np.fromiter(self.structured, np.int32, len(self.structured))
        constrained = sampling & np.isin(table_rows, rows_with_spec)
        for index in np.flatnonzero(constrained).tolist():  # the constrained rows only
            spec = self.structured[int(table_rows[index])]
            lengths[index] = len(spec)
            specs.append(spec)
        grammar_start = np.zeros(len(table_rows) + 1, np.int32)
        np.cumsum(lengths, out=grammar_start[1:])
        return {"grammar_start": grammar_start,
                "grammar_spec": np.concatenate(specs) if specs else np.zeros(0, np.uint8)}

    def _history(self, scheduled: list[ScheduledChunk], table_rows: np.ndarray, prompt_len: np.ndarray,
                 sampling: np.ndarray) -> dict[str, np.ndarray]:
        """The token ids the sampler reads of the requests that sample with penalties (prompt then
        output: the repetition penalty reads the prompt) or with a structured output only (its
        output, history_prompt_len 0: a long prompt is not shipped every step); empty ranges for
        the others. The known tokens: a structured output's from a placeholder lacks the one in
        flight."""
        rows = np.flatnonzero(self.needs_history[table_rows] & sampling)
        whole = self.has_penalties[table_rows[rows]]
        pieces = [scheduled[row].request.all_token_ids[0 if with_prompt else int(prompt_len[row]):]
                  for row, with_prompt in zip(rows.tolist(), whole.tolist(), strict=True)]
        lengths = np.zeros(len(scheduled), np.int32)
        lengths[rows] = [len(piece) for piece in pieces]
        history_start = np.zeros(len(scheduled) + 1, np.int32)
        np.cumsum(lengths, out=history_start[1:])
        history_prompt_len = np.zeros(len(scheduled), np.int32)
        history_prompt_len[rows] = np.where(whole, prompt_len[rows], 0)
        history_ids = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
        return {"history_start": history_start, "history_prompt_len": history_prompt_len,
                "history_ids": history_ids}
