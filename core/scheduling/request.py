"""The scheduler's view of one request, and what the scheduler reports about it after a step.

A Request is mutable state owned by the scheduler: its tokens so far, how many of them have KV in
the cache (`num_computed_tokens`), the pages and running-table row it holds while running. Tokens live in
one growing int32 buffer, so a step's input ids and a penalty history are slices, never Python loops.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.sampling_params import SamplingParams
from core.scheduling.prompt_logprobs import PromptLogprobs


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again, to be recomputed
    FINISHED_STOPPED = "stop"  # EOS or a stop token
    FINISHED_LENGTH = "length"  # max_tokens or max_model_len
    FINISHED_ABORTED = "abort"  # the client went away, or a step failed (then `error` says why)

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED


_FINISHED = frozenset({RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                       RequestStatus.FINISHED_ABORTED})


class Request:
    def __init__(self, request_id: str, prompt_token_ids: Sequence[int] | np.ndarray,
                 sampling_params: SamplingParams, arrival_s: float | None = None) -> None:
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.arrival_s = time.monotonic() if arrival_s is None else arrival_s
        prompt = np.asarray(prompt_token_ids, dtype=np.int32).ravel()
        self.prompt_len = len(prompt)
        # All tokens, prompt then output, with room for some output; append_token doubles it when full.
        self._token_ids = np.zeros(self.prompt_len + min(sampling_params.max_tokens, 64), np.int32)
        self._token_ids[: self.prompt_len] = prompt
        self.num_tokens = self.prompt_len
        self.last_token_id = int(prompt[-1]) if self.prompt_len else 0  # a decode step's input

        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose KV is written
        # With steps in flight (async scheduling): tokens scheduled in steps whose results are not in
        # yet, tokens those steps will sample, and the row this request has in the latest of them.
        self.num_inflight_tokens = 0
        self.num_pending_samples = 0
        self.last_step_row: tuple[int, int] | None = None  # (step id, row)
        # Set at the first admission, wherever it happens (a request moved off a dead replica before
        # it ever ran is first admitted on the replica that adopts it).
        self.num_cached_tokens = 0  # prefix-cache hit at the first admission
        self.first_admitted_s: float | None = None  # time.monotonic() of the first admission
        self.pages: list[int] = []  # one per block_size tokens, in order, while running
        self.row: int | None = None  # its row in the replica's RunningTable while running
        self.cache_node: Any = None  # the radix node it locked while running
        self.num_published_pages = 0  # leading pages in the prefix cache while running
        self.seed: int | None = None  # params.seed, or drawn by the scheduler at admission
        self.stop_reason: int | None = None  # the stop token id, when one of stop_token_ids ended it
        self.error: str | None = None  # why the engine (not the client) aborted it
        self.num_preemptions = 0
        self.prompt_prefix_keys: list[int] | None = None  # prefills_in_flight, computed at most once
        self.queue_time_s: float | None = None  # arrival to first admission; reported with the first token
        self.prompt_scores = (None if sampling_params.prompt_logprobs is None
                              else PromptLogprobs(self.prompt_token_ids, sampling_params.prompt_logprobs))

    @property
    def prompt_token_ids(self) -> np.ndarray:
        return self._token_ids[: self.prompt_len]

    @property
    def output_token_ids(self) -> np.ndarray:
        return self._token_ids[self.prompt_len : self.num_tokens]

    @property
    def all_token_ids(self) -> np.ndarray:
        """Prompt then output, a view valid until the next append."""
        return self._token_ids[: self.num_tokens]

    @property
    def num_reusable_tokens(self) -> int:
        """How many leading tokens may come from the prefix cache: none while its prompt is scored."""
        if self.prompt_scores is not None and not self.prompt_scores.delivered:
            return 0
        return self.num_tokens - 1  # a full hit still computes the last token: it yields the next one

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.prompt_len

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        """"stop", "length" or "abort" once finished, else None."""
        return self.status.value if self.status.is_finished else None

    def forget_kv(self) -> None:
        """Back to waiting with nothing computed, to be recomputed (a preemption, or a move off a dead
        replica): whatever it held there (pages, row, radix node, chunks in flight) is no longer its."""
        self.status = RequestStatus.PREEMPTED
        self.num_computed_tokens = 0
        self.num_inflight_tokens = self.num_pending_samples = 0  # its chunks in flight are void
        self.last_step_row = None
        self.pages = []
        self.row = None
        self.cache_node = None
        self.num_published_pages = 0

    def append_token(self, token_id: int) -> None:
        if self.num_tokens == len(self._token_ids):
            grown = np.zeros(2 * len(self._token_ids), np.int32)
            grown[: self.num_tokens] = self._token_ids
            self._token_ids = grown
        self._token_ids[self.num_tokens] = token_id
        self.num_tokens += 1
        self.last_token_id = token_id

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.value}, {self.prompt_len} prompt + "
                f"{self.num_output_tokens} output tokens, {self.num_computed_tokens} computed, "
                f"{len(self.pages)} pages)")


@dataclass(slots=True)
class TokenDelta:
    """The scheduler's word on one request after a step (or an abort): its new token ids, and
    finished=True on its last. The tokenizer turns these into OutputDeltas (text) for its client.

    Not frozen, though nobody changes it: a frozen dataclass costs 1 us to build, 0.2 ms a step
    with 256 requests decoding.
    """

    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None  # "stop", "length" or "abort" when finished
    stop_reason: int | None = None  # the stop token id when a stop_token_ids entry ended it
    # Per new token, when the request asked for logprobs: the sampled token's, and the top N as
    # (token id, logprob) pairs, best first.
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at the first admission
    # With the first token, when the request asked for prompt logprobs: per prompt token its logprob
    # (None for the first) and its top N (token id, logprob) pairs.
    prompt_logprobs: list[float | None] | None = None
    prompt_ranks: list[int | None] | None = None  # 1 + how many tokens the model found likelier
    prompt_top_logprobs: list[list[tuple[int, float]]] | None = None
    error: str | None = None  # why a request was aborted by the engine rather than the client
    queue_time_s: float | None = None  # with the first token only: arrival to first admission
