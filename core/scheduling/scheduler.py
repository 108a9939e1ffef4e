"""Scheduler: continuous batching for one replica, turning requests into StepPlans.

Every request has `num_computed_tokens` (tokens whose KV is written) and each step computes its
next chunk: the rest of a prompt (cut to fit the step), or one token when decoding. A step:

1. running requests first, oldest first: each takes its next chunk;
2. then waiting requests in arrival order (preempted ones at the front) while the token budget,
   the seats (max_num_seqs) and the pages allow, each reusing its longest prefix-cache match; one
   whose prompt a prefill in flight is computing past that match waits for its pages
   (core/scheduling/prefills_in_flight.py), and the next in line may go first.

Pages come from the pool; when it runs short the radix cache evicts, and when that is not enough
the NEWEST running request is preempted by recompute: its written pages go to the prefix cache,
it returns to the front of the waiting queue with nothing computed, and its recompute mostly hits
the cache. The oldest running request is never preempted, so the batch always makes progress.

Admission rejects (RequestRejectedError) what could never run (core/scheduling/admission.py says
what). Without chunked prefill a prompt runs whole when a step has room (a recompute longer than a
step is chunked anyway); long_prefill_token_threshold caps a chunk only with chunked prefill on.

`update()` takes the executor's StepResult and returns a TokenDelta per sampled token; requests
that end outside a step (aborts) are returned by the next `update()` or by `drain_outputs()`.

With `max_steps_in_flight` 1, `schedule()` and `update()` alternate. With 2 (async scheduling) the
next step is planned while the previous one runs: a request that samples in the step in flight
decodes in the next one with a placeholder input (the plan's `prev_row`), which the executor fills
on the device from the previous step's sampled tokens. Such a request is left out of the next step
when that pending token will be its last by length, or when it samples with penalties (its history
must be complete; a structured output's history may lack the pending token, which the executor
adds). One that stops on a token in the step in flight has computed one token for nothing, which
update() drops. Results come back in order and apply to the oldest step in flight; a chunk of a
request preempted or finished since it was planned is void.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

import numpy as np

from core.config import CacheConfig, SchedulerConfig
from core.plan import StepPlan, StepResult
from core.scheduling.admission import why_never_runs
from core.scheduling.block_pool import BlockPool
from core.scheduling.prefills_in_flight import PrefillsInFlight, prompt_prefix_keys
from core.scheduling.radix_cache import RadixCache
from core.scheduling.request import Request, RequestStatus, TokenDelta
from core.scheduling.request_outcome import final_output, stop_status, token_output
from core.scheduling.request_pages import RequestPages
from core.scheduling.running_table import RunningTable, ScheduledChunk
from core.scheduling.scheduler_stats import SchedulerCounts, SchedulerStats

_SEED_RANGE = 2**63
# How many waiting requests a step looks past when those ahead wait for a prefill in flight.
_MAX_WAITING_SKIPPED = 64


class RequestRejectedError(ValueError):
    """A request that can never be served; the message says why and what to change."""

    def __init__(self, request_id: str, message: str) -> None:
        super().__init__(message)
        self.request_id = request_id


class SchedulerError(RuntimeError):
    """The scheduler was driven out of its protocol or found its own invariant broken."""


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, num_pages: int,
                 max_model_len: int, eos_token_ids: Iterable[int], seed: int = 0, replica: int = 0,
                 max_steps_in_flight: int = 1) -> None:
        if max_steps_in_flight not in (1, 2):
            raise SchedulerError(f"max_steps_in_flight must be 1 or 2, got {max_steps_in_flight}")
        self.config = scheduler_config
        self.max_steps_in_flight = max_steps_in_flight
        self.block_size = cache_config.block_size
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.replica = replica
        self.pool = BlockPool(num_pages)
        self.cache = RadixCache(self.pool, self.block_size, enabled=cache_config.enable_prefix_caching)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the newest is last
        self._requests: dict[str, Request] = {}  # every unfinished request
        self._running = RunningTable(scheduler_config.max_num_seqs, -(-max_model_len // self.block_size),
                                     self.eos_token_ids)
        self._pages = RequestPages(self.pool, self.cache, self._running, self.block_size)
        self._prefix_keys = prompt_prefix_keys(self.block_size)
        self._rng = np.random.default_rng(seed)
        self._pending_outputs: list[TokenDelta] = []
        self._in_flight: deque[tuple[int, list[ScheduledChunk]]] = deque()  # (step id, chunks), oldest first
        self._next_step_id = 0
        self.counts = SchedulerCounts()

    # --- requests in ------------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a new request, or raise RequestRejectedError if it could never run."""
        if request.request_id in self._requests:
            raise RequestRejectedError(request.request_id,
                                       f"request {request.request_id!r} is already queued")
        problem = why_never_runs(request, self.config, self.max_model_len, self.block_size,
                                 self.pool.num_pages)
        if problem is not None:
            raise RequestRejectedError(request.request_id,
                                       f"request {request.request_id!r} rejected: {problem}")
        seed = request.sampling_params.seed
        request.seed = int(self._rng.integers(_SEED_RANGE)) if seed is None else seed
        self._requests[request.request_id] = request
        self.waiting.append(request)

    def abort_request(self, request_id: str) -> bool:
        """End a request in whatever state it is, freeing what it holds; False if not (or no longer) known.

        Its final output (finish_reason "abort") comes out of the next update() or drain_outputs().
        """
        request = self._requests.get(request_id)
        if request is None:
            return False
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
            if request.status is RequestStatus.PREEMPTED:
                self.counts.num_preempted -= 1
        self._finish(request, RequestStatus.FINISHED_ABORTED)
        self._pending_outputs.append(final_output(request))
        return True

    def evacuate(self) -> list[Request]:
        """Hand over every unfinished request, for another replica to `adopt` (this replica is dead).

        Nothing of this replica's KV is trusted any more: each request keeps its prompt, the tokens
        it generated and its seed, and will be recomputed wherever it lands, as after a preemption.
        The scheduler is unusable afterwards.
        """
        requests = [*self.running, *self.waiting]
        for request in requests:
            request.forget_kv()
        self.running, self.waiting, self._requests = [], deque(), {}
        self._in_flight.clear()
        return requests

    def adopt(self, request: Request) -> None:
        """Take over a request evacuated from another replica; it is recomputed at the queue's front."""
        if request.request_id in self._requests:
            raise SchedulerError(f"request {request.request_id!r} is already on replica {self.replica}")
        if request.status is not RequestStatus.PREEMPTED or request.row is not None:
            raise SchedulerError(f"adopt() takes evacuated requests, got {request!r}")
        request.num_preemptions += 1
        self._requests[request.request_id] = request
        self.waiting.appendleft(request)
        self.counts.num_preempted += 1

    def busy_reason(self) -> str | None:
        """Why this replica's prefix cache may not be flushed now (its requests), or None."""
        if not self._requests:
            return None
        return (f"replica {self.replica} has {len(self.running)} running and {len(self.waiting)} "
                "waiting request(s)")

    def flush_prefix_cache(self) -> int:
        """Drop every cached page; returns how many were freed. Only while no request runs or waits
        (SchedulerError says how many do): afterwards the pool is all free."""
        if (busy := self.busy_reason()) is not None:
            raise SchedulerError(busy)
        freed = self.cache.num_pages
        self.cache.reset()
        return freed

    def cached_prefix_len(self, token_ids: np.ndarray) -> int:
        """How many leading tokens of a prompt this replica's prefix cache holds (for the DP router)."""
        return self.cache.peek(token_ids)

    def has_unfinished(self) -> bool:
        return bool(self._requests or self._pending_outputs)

    def drain_outputs(self) -> list[TokenDelta]:
        """Outputs of requests that ended outside a step (aborts), when no step runs to carry them."""
        outputs, self._pending_outputs = self._pending_outputs, []
        return outputs

    # --- a step -----------------------------------------------------------------------------------
    def schedule(self) -> StepPlan | None:
        """The next step's plan, or None when there is nothing to run."""
        if len(self._in_flight) >= self.max_steps_in_flight:
            raise SchedulerError(
                f"step {self._in_flight[0][0]} is still in flight: call update() with its result first")
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledChunk] = []
        preempted = False
        index = 0
        block_size = self.block_size
        previous_step = self._in_flight[-1][0] if self._in_flight else None
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            start = request.num_computed_tokens + request.num_inflight_tokens
            total = request.num_tokens + request.num_pending_samples
            prev_row = -1
            if request.num_pending_samples:
                if self._pending_sample_is_last(request, total) or request.sampling_params.has_penalties:
                    index += 1
                    continue  # it waits for the step in flight
                step_id, prev_row = request.last_step_row
                if step_id != previous_step or total - start != 1:
                    raise SchedulerError(f"{request!r} waits for a token of step {step_id}, but the latest "
                                         f"step in flight is {previous_step}")
            num_todo = total - start
            num_new = 1 if num_todo == 1 else self._chunk(num_todo, budget)  # a decode, or a chunk
            seq_len = start + num_new
            if seq_len > len(request.pages) * block_size:
                ok, preempted_now = self._grow(request, seq_len, index)
                preempted |= preempted_now
                if not ok:
                    break  # the request preempted itself: it was the newest, nothing after it runs
            scheduled.append(ScheduledChunk(request, num_new, start, total, prev_row,
                                            request.num_preemptions))
            budget -= num_new
            index += 1
        # A step that had to preempt admits nobody: the pages are not there.
        waiting_may_run = self.waiting and self.cache.enabled and not preempted
        prefills = PrefillsInFlight.of(self.running, self._prefix_keys) if waiting_may_run else None
        skipped = 0
        while (len(self.waiting) > skipped and budget > 0 and not preempted
               and len(self.running) < self.config.max_num_seqs and skipped < _MAX_WAITING_SKIPPED):
            request = self.waiting[skipped]
            num_new = self._admit(request, skipped, budget, prefills)
            if num_new == 0:
                skipped += 1
                continue
            if num_new is None:
                break
            start = request.num_computed_tokens
            scheduled.append(ScheduledChunk(request, num_new, start, request.num_tokens, -1,
                                            request.num_preemptions))
            budget -= num_new
        if not scheduled:
            return None
        step_id = self._next_step_id
        plan = self._running.build_plan(scheduled, self.block_size, step_id, self.replica)
        if self.max_steps_in_flight > 1:  # what the next plan, made before this result, builds on
            for row, chunk in enumerate(scheduled):
                request = chunk.request
                request.num_inflight_tokens += chunk.num_new
                request.num_pending_samples += chunk.start + chunk.num_new == chunk.total
                request.last_step_row = (step_id, row)
        self._next_step_id += 1
        self._in_flight.append((step_id, scheduled))
        self.counts.num_tokens_last_step = plan.num_tokens
        return plan

    def _pending_sample_is_last(self, request: Request, total: int) -> bool:
        """Whether the tokens in flight reach max_tokens or max_model_len: nothing may follow them."""
        return (total - request.prompt_len >= request.sampling_params.max_tokens
                or total >= self.max_model_len)

    def update(self, plan: StepPlan, result: StepResult) -> list[TokenDelta]:
        """Apply a step's result: advance, append sampled tokens, finish; returns what to stream."""
        if not self._in_flight or self._in_flight[0][0] != plan.step_id:
            raise SchedulerError(f"update() for step {plan.step_id}, but the oldest step in flight is "
                                 f"{self._in_flight[0][0] if self._in_flight else None}")
        if result.step_id != plan.step_id:
            raise SchedulerError(f"the result of step {result.step_id} was given for step {plan.step_id}")
        scheduled = self._in_flight.popleft()[1]
        outputs = self.drain_outputs()
        if result.error is not None:
            return outputs + self._fail(scheduled, f"step {plan.step_id} failed: {result.error}")
        sampled = result.sampled_token_ids.tolist()
        logits_index = plan.logits_index.tolist()
        running = RequestStatus.RUNNING
        any_finished = False
        publish = self.cache.enabled
        block_size = self.block_size
        in_flight_counts = self.max_steps_in_flight > 1
        num_drained = len(outputs)
        for row, chunk in enumerate(scheduled):
            request = chunk.request
            if request.status is not running or request.num_preemptions != chunk.epoch:
                continue  # aborted, stopped or preempted since the step was planned: void
            if in_flight_counts:
                request.num_inflight_tokens -= chunk.num_new
            request.num_computed_tokens += chunk.num_new
            if publish and request.num_computed_tokens // block_size > request.num_published_pages:
                self._pages.publish_written(request)
            if request.prompt_scores is not None and result.prompt_logprob_start is not None:
                request.prompt_scores.record(chunk.start, result, row)
            if logits_index[row] < 0:
                continue  # a prefill chunk that does not reach the end samples nothing
            if in_flight_counts:
                request.num_pending_samples -= 1
            token = sampled[row]
            request.append_token(token)
            status = stop_status(request, token, self.eos_token_ids, self.max_model_len)
            if status is not None:
                self._finish(request, status)
                any_finished = True
            outputs.append(token_output(request, token, status, row, result))
        self.counts.num_generation_tokens += len(outputs) - num_drained  # one output per sampled token
        if any_finished:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        return outputs

    def stats(self) -> SchedulerStats:
        return SchedulerStats(step_id=self._next_step_id, num_running=len(self.running),
                              num_waiting=len(self.waiting), kv_usage=self.pool.usage,
                              num_free_pages=self.pool.num_free, num_cached_pages=self.pool.num_cached,
                              **self.counts.as_dict())

    # --- admission and pages ----------------------------------------------------------------------
    def _chunk(self, num_todo: int, budget: int) -> int:
        """How many of a request's uncomputed tokens run this step, chunking allowed."""
        threshold = self.config.long_prefill_token_threshold
        if self.config.enable_chunked_prefill and 0 < threshold < num_todo:
            num_todo = threshold
        return min(num_todo, budget)

    def _admit(self, request: Request, index: int, budget: int,
               prefills: PrefillsInFlight | None) -> int | None:
        """Start (or restart) waiting request `index`; its tokens this step, None if it must wait for
        room, 0 if for the pages of a prefill in flight."""
        match = self.cache.match(request.all_token_ids[: request.num_reusable_tokens])
        if prefills is not None and prefills.computes_beyond(request, match.length):
            return 0
        num_todo = request.num_tokens - match.length
        if self.config.enable_chunked_prefill or num_todo > self.config.max_num_batched_tokens:
            num_new = self._chunk(num_todo, budget)
        elif num_todo <= budget:
            num_new = num_todo
        else:
            return None  # no chunking: wait for a step with room for the whole prompt
        self._pages.hold(match)
        pages = self._pages.allocate(-(-(match.length + num_new) // self.block_size) - len(match.pages))
        if pages is None:
            self._pages.unhold(match)
            return None
        del self.waiting[index]
        if prefills is not None:
            prefills.add(request)
        if request.status is RequestStatus.PREEMPTED:
            self.counts.num_preempted -= 1
        if request.first_admitted_s is None:  # not "not preempted": an adopted request may never have run
            request.first_admitted_s = time.monotonic()
            request.num_cached_tokens = match.length
            request.queue_time_s = max(0.0, request.first_admitted_s - request.arrival_s)
            self.counts.num_prompt_tokens += request.prompt_len
            self.counts.prefix_cache_query_tokens += request.prompt_len
            self.counts.prefix_cache_hit_tokens += match.length
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = match.length
        self._pages.attach(request, match, pages)
        self.running.append(request)
        return num_new

    def _grow(self, request: Request, num_tokens: int, index: int) -> tuple[bool, bool]:
        """Give running request `index` pages for `num_tokens` tokens, preempting newer ones if needed.

        Returns (whether it got them, whether anyone was preempted). It fails only when it was the
        newest request and had to preempt itself.
        """
        num_needed = -(-num_tokens // self.block_size) - len(request.pages)
        if num_needed <= 0:
            return True, False
        preempted = False
        while (pages := self._pages.allocate(num_needed)) is None:
            victim = self.running[-1]
            if victim is request and index == 0:
                raise SchedulerError(
                    f"request {request.request_id!r} alone needs {num_needed} more pages for {num_tokens} "
                    f"tokens, but the pool has {self.pool.num_free} free of {self.pool.num_pages} "
                    f"({self.pool.num_owned} owned): admission should have rejected it")
            self._preempt(victim)
            preempted = True
            if victim is request:
                return False, True
        self._pages.extend(request, pages)
        return True, preempted

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self._pages.release(request, publish=True)
        request.forget_kv()
        request.num_preemptions += 1
        self.waiting.appendleft(request)
        self.counts.num_preempted += 1
        self.counts.num_preemptions += 1

    # --- finishing --------------------------------------------------------------------------------
    def _finish(self, request: Request, status: RequestStatus) -> None:
        """Mark finished and free what it holds; the caller takes it out of running or waiting."""
        if request.row is not None:
            # A failed step's KV is not trusted: nothing of it goes to the cache.
            self._pages.release(request, publish=request.error is None)
        request.status = status
        del self._requests[request.request_id]

    def _fail(self, scheduled: list[ScheduledChunk], message: str) -> list[TokenDelta]:
        outputs = []
        for chunk in scheduled:
            request = chunk.request
            if request.status is RequestStatus.RUNNING and request.num_preemptions == chunk.epoch:
                request.error = message
                self._finish(request, RequestStatus.FINISHED_ABORTED)
                outputs.append(final_output(request))
        self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        return outputs
