"""Scheduler: budgets, chunked prefill, prefix-cache admission, preemption, aborts, stops, the plan.

Most tests drive the scheduler with tests/fake_runner.py, whose tokens depend on the KV it reads
through the plan's pages, and compare every request's tokens with `reference_tokens`, which
generates them from the token sequence alone. After every step the pool and the radix cache
check their invariants; after every test no page is owned.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable

import numpy as np
import pytest
from fake_runner import FakeRunner, reference_tokens
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.config import CacheConfig, SchedulerConfig
from core.plan import StepPlan, StepResult
from core.sampling_params import SamplingParams
from core.scheduling.request import Request, RequestStatus, TokenDelta
from core.scheduling.scheduler import RequestRejectedError, Scheduler, SchedulerError
from core.structured.specs import choice_spec

EOS = 7
VOCAB = 50
MAX_MODEL_LEN = 256


def make_scheduler(num_pages: int = 256, block_size: int = 4, max_num_seqs: int = 8,
                   max_num_batched_tokens: int = 64, chunked: bool = True, threshold: int = 0,
                   prefix_caching: bool = True, max_model_len: int = MAX_MODEL_LEN,
                   fail_at_step: int | None = None, steps_in_flight: int = 1) -> tuple[Scheduler, FakeRunner]:
    scheduler = Scheduler(
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                        enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold),
        CacheConfig(block_size=block_size, enable_prefix_caching=prefix_caching),
        num_pages=num_pages, max_model_len=max_model_len, eos_token_ids=(EOS,), seed=0,
        max_steps_in_flight=steps_in_flight,
    )
    return scheduler, FakeRunner(num_pages, block_size, VOCAB, fail_at_step=fail_at_step)


def prompt(seed: int, length: int, prefix: list[int] | None = None) -> list[int]:
    rng = np.random.default_rng(seed)
    return list(prefix or []) + rng.integers(0, VOCAB, length).tolist()


def expected(scheduler: Scheduler, request: Request) -> list[int]:
    return reference_tokens(request.prompt_token_ids, request.sampling_params, request.seed, (EOS,),
                            scheduler.max_model_len, VOCAB)


class Outcome:
    """Everything the scheduler said, per request."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = defaultdict(list)
        self.final: dict[str, TokenDelta] = {}
        self.outputs: list[TokenDelta] = []

    def record(self, outputs: list[TokenDelta]) -> None:
        for output in outputs:
            assert output.request_id not in self.final, f"{output.request_id} spoke after finishing"
            self.tokens[output.request_id].extend(output.new_token_ids)
            self.outputs.append(output)
            if output.finished:
                self.final[output.request_id] = output


def step(scheduler: Scheduler, runner: FakeRunner, outcome: Outcome) -> StepPlan | None:
    """One schedule/run/update turn with every per-step check."""
    plan = scheduler.schedule()
    if plan is None:
        outputs = scheduler.drain_outputs()
        assert outputs or not scheduler.has_unfinished(), "unfinished requests, but nothing to schedule"
    else:
        assert plan.num_tokens <= scheduler.config.max_num_batched_tokens, "the token budget was exceeded"
        assert plan.num_reqs <= scheduler.config.max_num_seqs
        outputs = scheduler.update(plan, runner.run(plan))
    outcome.record(outputs)
    scheduler.pool.check()
    scheduler.cache.check()
    return plan


def drive(scheduler: Scheduler, runner: FakeRunner, outcome: Outcome | None = None,
          max_steps: int = 5000) -> Outcome:
    outcome = outcome or Outcome()
    for _ in range(max_steps):
        if not scheduler.has_unfinished():
            break
        step(scheduler, runner, outcome)
    else:
        pytest.fail(f"requests still unfinished after {max_steps} steps: {scheduler.stats()}")
    assert_balanced(scheduler)
    return outcome


class AsyncDriver:
    """Two steps in flight, as with async scheduling: plan the next step before the oldest's result.

    The fake runner runs each step as soon as it is planned, in order, like a GPU stream: a step's
    placeholders read the step before it, whose result the scheduler has not seen yet.
    """

    def __init__(self, scheduler: Scheduler, runner: FakeRunner) -> None:
        self.scheduler, self.runner = scheduler, runner
        self.in_flight: deque[tuple[StepPlan, StepResult]] = deque()
        self.plans: list[StepPlan] = []

    def turn(self, outcome: Outcome) -> None:
        scheduler = self.scheduler
        while len(self.in_flight) < scheduler.max_steps_in_flight:
            plan = scheduler.schedule()
            if plan is None:
                break
            assert plan.num_tokens <= scheduler.config.max_num_batched_tokens
            self.plans.append(plan)
            self.in_flight.append((plan, self.runner.run(plan)))
        if self.in_flight:
            plan, result = self.in_flight.popleft()
            outcome.record(scheduler.update(plan, result))
        else:
            outputs = scheduler.drain_outputs()
            assert outputs or not scheduler.has_unfinished(), "unfinished requests, but nothing to schedule"
            outcome.record(outputs)
        scheduler.pool.check()
        scheduler.cache.check()

    def drive(self, outcome: Outcome | None = None, max_turns: int = 5000) -> Outcome:
        outcome = outcome or Outcome()
        for _ in range(max_turns):
            if not self.scheduler.has_unfinished() and not self.in_flight:
                break
            self.turn(outcome)
        else:
            pytest.fail(f"requests still unfinished after {max_turns} turns: {self.scheduler.stats()}")
        assert_balanced(self.scheduler)
        return outcome


def step_until(scheduler: Scheduler, runner: FakeRunner, outcome: Outcome, done: Callable[[], bool],
               max_steps: int = 500) -> None:
    for _ in range(max_steps):
        if done():
            return
        step(scheduler, runner, outcome)
    pytest.fail("the awaited state never came")


def assert_balanced(scheduler: Scheduler) -> None:
    """Nothing runs, so no page is owned: every page is free or cached."""
    pool = scheduler.pool
    pool.check()
    scheduler.cache.check()
    assert pool.num_owned == 0 and pool.num_free + pool.num_cached == pool.num_pages
    assert not scheduler.running and not scheduler.waiting and not scheduler.has_unfinished()


def add(scheduler: Scheduler, request_id: str, tokens: list[int], **params) -> Request:
    request = Request(request_id, tokens, SamplingParams(**{"temperature": 0.0, **params}))
    scheduler.add_request(request)
    return request


def assert_reference_tokens(scheduler: Scheduler, outcome: Outcome, requests: list[Request]) -> None:
    for request in requests:
        assert outcome.tokens[request.request_id] == expected(scheduler, request), request.request_id
        assert outcome.final[request.request_id].finish_reason in ("stop", "length")


def mixed_workload(scheduler: Scheduler, num_requests: int = 12) -> list[Request]:
    shared = prompt(1000, 24)
    requests = []
    for i in range(num_requests):
        tokens = prompt(i, 3 + 7 * i % 40, prefix=shared if i % 3 else None)
        params = {"max_tokens": 4 + (5 * i) % 30}
        if i % 2:
            params.update(temperature=1.0, seed=100 + i)
        requests.append(add(scheduler, f"r{i}", tokens, **params))
    return requests


# --- budgets and chunks ----------------------------------------------------------------------------


def test_every_step_stays_within_the_token_budget_and_the_seats():
    scheduler, runner = make_scheduler(max_num_seqs=4, max_num_batched_tokens=32)
    requests = mixed_workload(scheduler, 16)
    outcome = drive(scheduler, runner)  # step() asserts budget and seats every step
    assert_reference_tokens(scheduler, outcome, requests)
    assert max(plan.num_tokens for plan in runner.plans) == 32
    assert max(plan.num_reqs for plan in runner.plans) == 4


def test_a_long_prompt_spans_several_steps_and_samples_only_at_its_end():
    scheduler, runner = make_scheduler(max_num_batched_tokens=32)
    request = add(scheduler, "long", prompt(1, 100), max_tokens=3, ignore_eos=True)
    outcome = drive(scheduler, runner)
    prefill = runner.plans[:4]
    assert [plan.num_tokens for plan in prefill] == [32, 32, 32, 4]
    assert [int(plan.logits_index[0]) for plan in prefill] == [-1, -1, -1, 3]
    assert [int(plan.positions[0]) for plan in prefill] == [0, 32, 64, 96]
    assert outcome.tokens["long"] == expected(scheduler, request)


def test_decode_and_prefill_chunks_share_a_step():
    scheduler, runner = make_scheduler(max_num_batched_tokens=16)
    outcome = Outcome()
    first = add(scheduler, "short", prompt(1, 5), max_tokens=20, ignore_eos=True)
    step(scheduler, runner, outcome)
    second = add(scheduler, "long", prompt(2, 40), max_tokens=5)
    plan = step(scheduler, runner, outcome)
    assert plan.num_reqs == 2 and list(np.diff(plan.query_start)) == [1, 15]
    assert plan.logits_index[0] == 0 and plan.logits_index[1] == -1
    outcome = drive(scheduler, runner, outcome)
    assert_reference_tokens(scheduler, outcome, [first, second])


def test_a_one_token_prefill_chunk_feeds_the_prompts_next_token_not_its_last():
    scheduler, runner = make_scheduler(max_num_batched_tokens=16)
    first = add(scheduler, "a", prompt(1, 15), max_tokens=4, ignore_eos=True)
    second = add(scheduler, "b", prompt(2, 20), max_tokens=4, ignore_eos=True)
    outcome = Outcome()
    plan = step(scheduler, runner, outcome)
    assert list(np.diff(plan.query_start)) == [15, 1] and plan.logits_index[1] == -1
    assert plan.input_ids[15] == second.prompt_token_ids[0]
    assert_reference_tokens(scheduler, drive(scheduler, runner, outcome), [first, second])


def test_long_prefill_token_threshold_caps_one_requests_share_of_a_step():
    scheduler, runner = make_scheduler(max_num_batched_tokens=64, threshold=8)
    requests = [add(scheduler, f"r{i}", prompt(i, 30), max_tokens=4) for i in range(3)]
    outcome = Outcome()
    plan = step(scheduler, runner, outcome)
    assert list(np.diff(plan.query_start)) == [8, 8, 8]
    assert_reference_tokens(scheduler, drive(scheduler, runner, outcome), requests)


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room():
    scheduler, runner = make_scheduler(max_num_batched_tokens=32, chunked=False)
    first = add(scheduler, "a", prompt(1, 20), max_tokens=6, ignore_eos=True)
    second = add(scheduler, "b", prompt(2, 20), max_tokens=6, ignore_eos=True)
    outcome = drive(scheduler, runner)
    assert list(np.diff(runner.plans[0].query_start)) == [20]  # b does not fit the 12 left
    assert list(np.diff(runner.plans[1].query_start)) == [1, 20]
    assert all((plan.logits_index >= 0).all() for plan in runner.plans), "a prompt was split"
    assert_reference_tokens(scheduler, outcome, [first, second])


# --- admission -------------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens, params, config, message", [
    ([], {}, {}, "the prompt is empty"),
    (list(range(250)), {"max_tokens": 10}, {},
     r"250 prompt tokens \+ max_tokens 10 exceed max_model_len 256"),
    (list(range(40)), {"max_tokens": 30}, {"num_pages": 16}, "need 18 KV pages of 4 tokens, the pool has 16"),
    (list(range(40)), {}, {"chunked": False, "max_num_batched_tokens": 32},
     "more than max_num_batched_tokens 32, and chunked prefill is off"),
])
def test_requests_that_can_never_run_are_rejected_with_a_message(tokens, params, config, message):
    scheduler, _ = make_scheduler(**config)
    with pytest.raises(RequestRejectedError, match=message) as error:
        add(scheduler, "doomed", tokens, **params)
    assert error.value.request_id == "doomed" and "request 'doomed' rejected" in str(error.value)
    assert not scheduler.has_unfinished()


def test_a_request_id_already_queued_is_rejected():
    scheduler, _ = make_scheduler()
    add(scheduler, "twin", [1, 2, 3])
    with pytest.raises(RequestRejectedError, match="already queued"):
        add(scheduler, "twin", [4, 5, 6])


def test_requests_that_each_need_the_whole_pool_take_turns():
    # 10 prompt + 30 output tokens need 10 pages: the whole pool, so they can only run one at a time.
    scheduler, runner = make_scheduler(num_pages=10)
    requests = [add(scheduler, f"r{i}", prompt(i, 10), max_tokens=30, ignore_eos=True) for i in range(3)]
    assert_reference_tokens(scheduler, drive(scheduler, runner), requests)


def test_the_seed_is_drawn_at_admission_unless_given_and_travels_in_the_plan():
    scheduler, runner = make_scheduler()
    drawn = add(scheduler, "drawn", prompt(1, 5), temperature=1.0)
    given_seed = add(scheduler, "given", prompt(2, 5), temperature=1.0, seed=1234)
    assert drawn.seed is not None and given_seed.seed == 1234
    again, _ = make_scheduler()
    assert add(again, "drawn", prompt(1, 5), temperature=1.0).seed == drawn.seed  # seeded generator
    outcome = Outcome()
    plan = step(scheduler, runner, outcome)
    assert sorted(plan.sampling["seed"].tolist()) == sorted([drawn.seed, 1234])
    assert_reference_tokens(scheduler, drive(scheduler, runner, outcome), [drawn, given_seed])


# --- prefix cache ----------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt_len, cached, computed", [(16, 12, 4), (17, 16, 1)])
def test_a_full_prompt_cache_hit_still_computes_the_last_prompt_token(prompt_len, cached, computed):
    scheduler, runner = make_scheduler()
    tokens = prompt(3, prompt_len)
    cold = add(scheduler, "cold", tokens, max_tokens=5, ignore_eos=True)
    outcome = drive(scheduler, runner)
    hot = add(scheduler, "hot", tokens, max_tokens=5, ignore_eos=True)
    plan = step(scheduler, runner, outcome)
    assert hot.num_cached_tokens == cached
    assert plan.num_tokens == computed and plan.positions[-1] == prompt_len - 1
    assert plan.logits_index[0] == computed - 1
    outcome = drive(scheduler, runner, outcome)
    assert outcome.tokens["hot"] == outcome.tokens["cold"] == expected(scheduler, cold)
    assert outcome.final["hot"].num_cached_tokens == cached


def test_a_flush_refuses_while_a_request_waits_or_runs_then_frees_every_cached_page():
    scheduler, runner = make_scheduler()
    tokens = prompt(5, 17)
    add(scheduler, "cold", tokens, max_tokens=3, ignore_eos=True)
    outcome = drive(scheduler, runner)
    add(scheduler, "busy", prompt(6, 9), max_tokens=3, ignore_eos=True)
    with pytest.raises(SchedulerError, match="replica 0 has 0 running and 1 waiting request"):
        scheduler.flush_prefix_cache()
    step(scheduler, runner, outcome)
    with pytest.raises(SchedulerError, match="replica 0 has 1 running and 0 waiting request"):
        scheduler.flush_prefix_cache()
    outcome = drive(scheduler, runner, outcome)
    cached = scheduler.pool.num_cached
    assert cached >= 4 + 2  # both requests' whole pages
    assert scheduler.flush_prefix_cache() == cached
    assert scheduler.pool.num_free == scheduler.pool.num_pages and scheduler.cache.num_pages == 0
    scheduler.cache.check()
    add(scheduler, "again", tokens, max_tokens=3, ignore_eos=True)
    outcome = drive(scheduler, runner, outcome)
    assert outcome.final["again"].num_cached_tokens == 0
    assert outcome.tokens["again"] == outcome.tokens["cold"]


def test_cold_and_hot_prefix_cache_give_identical_tokens_and_the_hot_pass_counts_hits():
    scheduler, runner = make_scheduler(num_pages=1024)  # room to keep everything cached
    cold = mixed_workload(scheduler)
    cold_outcome = drive(scheduler, runner)
    cold_stats = scheduler.stats()
    hot = [add(scheduler, f"hot-{r.request_id}", r.prompt_token_ids.tolist(),
               max_tokens=r.sampling_params.max_tokens, temperature=r.sampling_params.temperature,
               seed=r.seed) for r in cold]
    hot_outcome = drive(scheduler, runner)
    for c, h in zip(cold, hot):
        assert hot_outcome.tokens[h.request_id] == cold_outcome.tokens[c.request_id]
        assert h.num_cached_tokens == (h.prompt_len - 1) // 4 * 4  # all but the last token's page
    hot_hits = scheduler.stats().prefix_cache_hit_tokens - cold_stats.prefix_cache_hit_tokens
    assert hot_hits == sum(h.num_cached_tokens for h in hot) > 0
    assert_reference_tokens(scheduler, cold_outcome, cold)


def test_without_prefix_caching_nothing_is_cached_and_tokens_are_the_same():
    scheduler, runner = make_scheduler(prefix_caching=False)
    requests = mixed_workload(scheduler)
    outcome = drive(scheduler, runner)
    assert_reference_tokens(scheduler, outcome, requests)
    assert scheduler.pool.num_free == scheduler.pool.num_pages
    assert scheduler.stats().prefix_cache_hit_tokens == 0


def test_identical_prompts_running_together_publish_one_copy_of_their_pages():
    scheduler, runner = make_scheduler()
    tokens = prompt(5, 20)
    requests = [add(scheduler, f"r{i}", tokens, max_tokens=4, ignore_eos=True) for i in range(3)]
    outcome = drive(scheduler, runner)
    assert_reference_tokens(scheduler, outcome, requests)
    # All three computed the same 20 + 3 tokens side by side, each in its own pages: the first to
    # finish publishes its 5 full pages, the others' copies are handed back and freed.
    assert scheduler.cache.match(tokens).length == 20
    assert scheduler.pool.num_cached == scheduler.cache.num_pages == 5
    assert scheduler.pool.num_free == scheduler.pool.num_pages - 5


# --- preemption ------------------------------------------------------------------------------------


def test_preemption_under_a_tiny_pool_keeps_every_requests_tokens():
    roomy, roomy_runner = make_scheduler(num_pages=512)
    tiny, tiny_runner = make_scheduler(num_pages=24)
    roomy_requests, tiny_requests = mixed_workload(roomy), mixed_workload(tiny)
    roomy_outcome, tiny_outcome = drive(roomy, roomy_runner), drive(tiny, tiny_runner)
    assert tiny.stats().num_preemptions > 0 and roomy.stats().num_preemptions == 0
    assert_reference_tokens(tiny, tiny_outcome, tiny_requests)
    assert dict(tiny_outcome.tokens) == dict(roomy_outcome.tokens)
    assert_reference_tokens(roomy, roomy_outcome, roomy_requests)


def test_a_preempted_request_goes_first_and_its_recompute_hits_the_cache():
    # Two requests that together outgrow 12 pages: the newer one is preempted, its pages cached.
    scheduler, runner = make_scheduler(num_pages=12, max_num_batched_tokens=64)
    old = add(scheduler, "old", prompt(1, 17), max_tokens=24, ignore_eos=True)
    new = add(scheduler, "new", prompt(2, 17), max_tokens=16, ignore_eos=True)
    outcome = Outcome()
    step_until(scheduler, runner, outcome, lambda: new.status is RequestStatus.PREEMPTED)
    assert old.status is RequestStatus.RUNNING and scheduler.waiting[0] is new
    assert scheduler.stats().num_preempted == 1
    hits_before = scheduler.cache.num_hit_tokens
    step_until(scheduler, runner, outcome, lambda: new.status is RequestStatus.RUNNING)
    assert scheduler.cache.num_hit_tokens > hits_before, "the recompute found nothing in the cache"
    assert_reference_tokens(scheduler, drive(scheduler, runner, outcome), [old, new])
    assert new.num_preemptions >= 1 and old.num_preemptions == 0


def test_written_pages_are_shared_while_their_writer_still_runs():
    scheduler, runner = make_scheduler(max_num_batched_tokens=16)
    first = add(scheduler, "first", prompt(3, 40), max_tokens=8, ignore_eos=True)
    outcome = Outcome()
    step(scheduler, runner, outcome)  # the first 16 prompt tokens: four full pages, published
    second = add(scheduler, "second", prompt(3, 40), max_tokens=8, ignore_eos=True)
    step_until(scheduler, runner, outcome, lambda: second.status is RequestStatus.RUNNING)
    assert first.status is RequestStatus.RUNNING
    assert second.num_cached_tokens >= 16, "the second request did not reuse the first one's pages"
    shared = set(first.pages) & set(second.pages)
    assert len(shared) >= 4 and all(scheduler.pool.refcount(p) == 2 for p in shared)
    assert_reference_tokens(scheduler, drive(scheduler, runner, outcome), [first, second])


def test_same_prefix_written_in_one_step_keeps_one_copy():
    scheduler, runner = make_scheduler(max_num_batched_tokens=64)
    a = add(scheduler, "a", prompt(4, 20), max_tokens=4, ignore_eos=True)
    b = add(scheduler, "b", prompt(4, 20), max_tokens=4, ignore_eos=True)
    outcome = Outcome()
    step(scheduler, runner, outcome)  # both prefill together: neither could match the other
    assert a.pages[:5] == b.pages[:5], "the later writer should switch to the tree's copy"
    assert scheduler.cache.num_pages == 5
    assert_reference_tokens(scheduler, drive(scheduler, runner, outcome), [a, b])
    assert scheduler.pool.num_owned == 0


# --- aborts ----------------------------------------------------------------------------------------


def _reach(state: str) -> tuple[Scheduler, FakeRunner, Outcome, Request, list[Request]]:
    """A scheduler with request "victim" in `state`, and the other requests."""
    if state == "preempted":
        scheduler, runner = make_scheduler(num_pages=12)
        others = [add(scheduler, "old", prompt(1, 17), max_tokens=24, ignore_eos=True)]
        victim = add(scheduler, "victim", prompt(2, 17), max_tokens=16, ignore_eos=True)
        done = lambda: victim.status is RequestStatus.PREEMPTED  # noqa: E731
    else:
        scheduler, runner = make_scheduler(max_num_seqs=2 if state == "waiting" else 8,
                                           max_num_batched_tokens=16)
        others = [add(scheduler, f"other{i}", prompt(i, 6), max_tokens=12, ignore_eos=True) for i in range(2)]
        victim = add(scheduler, "victim", prompt(9, 40, prefix=prompt(0, 6)), max_tokens=12, ignore_eos=True)
        done = {
            "waiting": lambda: scheduler.running and victim.status is RequestStatus.WAITING,
            # Past the prefix it shares with other0 (whose copy it switched to), into pages of its own.
            "mid-prefill": lambda: (victim.status is RequestStatus.RUNNING
                                    and 12 <= victim.num_computed_tokens < victim.prompt_len),
            "decoding": lambda: victim.num_output_tokens >= 2,
        }[state]
    outcome = Outcome()
    step_until(scheduler, runner, outcome, done)
    return scheduler, runner, outcome, victim, others


@pytest.mark.parametrize("state", ["waiting", "mid-prefill", "decoding", "preempted"])
def test_abort_frees_every_page_in_each_state(state):
    scheduler, runner, outcome, victim, others = _reach(state)
    pool = scheduler.pool
    owned_before = pool.num_owned
    held_alone = [page for page in victim.pages if pool.refcount(page) == 1]
    assert bool(held_alone) == (state in ("mid-prefill", "decoding"))
    assert scheduler.abort_request("victim")
    assert victim.status is RequestStatus.FINISHED_ABORTED and victim.pages == [] and victim.row is None
    assert pool.num_owned == owned_before - len(held_alone)
    assert all(pool.refcount(page) == 0 for page in held_alone)
    scheduler.pool.check()
    scheduler.cache.check()
    outcome = drive(scheduler, runner, outcome)
    assert outcome.final["victim"].finish_reason == "abort" and outcome.final["victim"].new_token_ids == []
    assert_reference_tokens(scheduler, outcome, others)


def test_abort_while_its_step_runs_is_skipped_by_update():
    scheduler, runner = make_scheduler()
    victim = add(scheduler, "victim", prompt(1, 10), max_tokens=20, ignore_eos=True)
    other = add(scheduler, "other", prompt(2, 10), max_tokens=5)
    outcome = Outcome()
    plan = scheduler.schedule()
    assert scheduler.abort_request("victim")
    outputs = scheduler.update(plan, runner.run(plan))
    assert [o.request_id for o in outputs] == ["victim", "other"] and outputs[0].finish_reason == "abort"
    outcome.record(outputs)
    outcome = drive(scheduler, runner, outcome)
    assert victim.num_output_tokens == 0
    assert_reference_tokens(scheduler, outcome, [other])


def test_abort_of_an_unknown_or_finished_request_is_a_no_op():
    scheduler, runner = make_scheduler()
    add(scheduler, "done", prompt(1, 5), max_tokens=2)
    outcome = drive(scheduler, runner)
    assert not scheduler.abort_request("done") and not scheduler.abort_request("never-seen")
    assert scheduler.drain_outputs() == [] and outcome.final["done"].finish_reason in ("stop", "length")


def test_an_abort_with_no_step_to_carry_it_comes_out_of_drain_outputs():
    scheduler, _ = make_scheduler()
    add(scheduler, "lonely", prompt(1, 5))
    scheduler.abort_request("lonely")
    assert scheduler.has_unfinished() and scheduler.schedule() is None
    [output] = scheduler.drain_outputs()
    assert output.finished and output.finish_reason == "abort"
    assert_balanced(scheduler)


def test_a_failed_step_aborts_its_requests_with_the_error():
    scheduler, runner = make_scheduler(fail_at_step=3)
    requests = mixed_workload(scheduler, 4)
    outcome = drive(scheduler, runner)
    failed = [o for o in outcome.final.values() if o.error]
    assert failed and all("step 3 failed: executor dp=0 tp=0: CUDA error" in o.error for o in failed)
    assert all(o.finish_reason == "abort" for o in failed)
    assert len(failed) == runner.plans[3].num_reqs
    assert_reference_tokens(scheduler, outcome, [r for r in requests if r.request_id not in
                                                 {o.request_id for o in failed}])


def test_a_failed_step_publishes_nothing_to_the_prefix_cache():
    scheduler, runner = make_scheduler(max_num_batched_tokens=16, fail_at_step=2)
    add(scheduler, "r", prompt(1, 60), max_tokens=4)
    outcome = drive(scheduler, runner)
    assert outcome.final["r"].error
    # The two good steps' 32 tokens were shared as they were written; the failed step's are not.
    assert scheduler.pool.num_cached == 32 // 4 and scheduler.pool.num_owned == 0
    assert scheduler.cache.match(prompt(1, 60)).length == 32
    scheduler.pool.check()
    scheduler.cache.check()


# --- stopping --------------------------------------------------------------------------------------


def scripted(scheduler: Scheduler, tokens: list[int]) -> list[TokenDelta]:
    """Run steps that sample `tokens[i]` for every sampling request at step i; returns all outputs."""
    outputs = []
    for token in tokens:
        plan = scheduler.schedule()
        if plan is None:
            break
        result = StepResult(plan.step_id, 0, np.full(plan.num_reqs, token, np.int32))
        outputs += scheduler.update(plan, result)
    return outputs


@pytest.mark.parametrize("params, script, tokens, reason, stop_reason", [
    ({}, [EOS, 1], [EOS], "stop", None),
    ({"ignore_eos": True, "max_tokens": 3}, [EOS, EOS, EOS, EOS], [EOS, EOS, EOS], "length", None),
    ({"min_tokens": 3}, [EOS, EOS, EOS, 1], [EOS, EOS, EOS], "stop", None),
    ({"stop_token_ids": (11,)}, [1, 11, 1], [1, 11], "stop", 11),
    ({"stop_token_ids": (11,), "min_tokens": 2}, [11, 11], [11, 11], "stop", 11),
    ({"max_tokens": 2}, [1, 2, 3], [1, 2], "length", None),
])
def test_stop_rules(params, script, tokens, reason, stop_reason):
    scheduler, _ = make_scheduler()
    add(scheduler, "r", [1, 2, 3], **params)
    outputs = scripted(scheduler, script)
    assert [t for o in outputs for t in o.new_token_ids] == tokens
    assert outputs[-1].finished and [o.finished for o in outputs].count(True) == 1
    assert (outputs[-1].finish_reason, outputs[-1].stop_reason) == (reason, stop_reason)
    assert_balanced(scheduler)


def test_min_tokens_bans_the_stop_tokens_in_the_plan_until_they_are_out():
    scheduler, _ = make_scheduler()
    add(scheduler, "r", [1, 2, 3], min_tokens=2, max_tokens=5, stop_token_ids=(11,),
        logit_bias=((7, 2.0),))
    add(scheduler, "free", [4, 5, 6], max_tokens=5)
    banned = []
    for _ in range(4):
        plan = scheduler.schedule()
        row = plan.bias_ids[plan.bias_start[0]:plan.bias_start[1]].tolist()
        values = plan.bias_values[plan.bias_start[0]:plan.bias_start[1]].tolist()
        assert (row[0], values[0]) == (7, 2.0)  # its own bias, every step
        banned.append(dict(zip(row[1:], values[1:], strict=True)))
        assert plan.bias_start[2] == plan.bias_start[1]  # the other request: nothing
        scheduler.update(plan, StepResult(plan.step_id, 0, np.full(plan.num_reqs, 1, np.int32)))
    assert banned[:2] == [{EOS: -np.inf, 11: -np.inf}] * 2 and banned[2:] == [{}, {}]
    assert scheduler._running.min_tokens == {}  # past min_tokens the row no longer takes this path


def test_a_structured_output_ends_at_its_end_token_before_min_tokens():
    scheduler, _ = make_scheduler()
    add(scheduler, "r", [1, 2, 3], min_tokens=4, structured_output=choice_spec(["a"]))
    plan = scheduler.schedule()
    assert not len(plan.bias_ids)  # no ban: the grammar allows only the end once its form is done
    outputs = scheduler.update(plan, StepResult(plan.step_id, 0, np.full(plan.num_reqs, EOS, np.int32)))
    assert outputs[-1].finished and outputs[-1].finish_reason == "stop"


def test_max_model_len_ends_a_request_with_length():
    scheduler, _ = make_scheduler(max_model_len=8)
    add(scheduler, "r", [1, 2, 3, 4, 5], max_tokens=3)
    outputs = scripted(scheduler, [1] * 5)
    assert len(outputs) == 3 and outputs[-1].finish_reason == "length"


# --- the plan --------------------------------------------------------------------------------------


def test_logprobs_come_back_only_for_requests_that_ask():
    scheduler, runner = make_scheduler()
    add(scheduler, "with", prompt(1, 5), max_tokens=3, logprobs=2)
    add(scheduler, "without", prompt(2, 5), max_tokens=3)
    outcome = drive(scheduler, runner)
    for output in outcome.outputs:
        if output.request_id == "with":
            assert len(output.logprobs) == 1 and len(output.top_logprobs[0]) == 2
            assert output.top_logprobs[0][0][0] == output.new_token_ids[0]
        else:
            assert output.logprobs is None and output.top_logprobs is None


def test_penalty_history_covers_the_context_of_penalized_requests_only():
    scheduler, runner = make_scheduler()
    penalized = add(scheduler, "penalized", prompt(1, 9), max_tokens=4, repetition_penalty=1.2,
                    ignore_eos=True)
    add(scheduler, "plain", prompt(2, 9), max_tokens=4, ignore_eos=True)
    outcome = Outcome()
    step(scheduler, runner, outcome)
    plan = step(scheduler, runner, outcome)  # both decode; the fake runner checks the history
    lengths = np.diff(plan.history_start)
    row = int(np.flatnonzero(plan.sampling["repetition_penalty"] != 1.0)[0])
    assert lengths[row] == 10 and lengths.sum() == 10 and plan.history_prompt_len[row] == 9
    assert plan.history_ids.tolist() == penalized.all_token_ids[:10].tolist()  # before this step's token
    drive(scheduler, runner, outcome)


def test_sampling_parameters_travel_per_request():
    scheduler, runner = make_scheduler()
    add(scheduler, "a", [1, 2, 3], temperature=0.5, top_p=0.9, top_k=-1, min_p=0.1, presence_penalty=0.5)
    add(scheduler, "b", [4, 5, 6], top_k=20, frequency_penalty=-1.0)
    plan = scheduler.schedule()
    sampling = plan.sampling
    assert sampling["temperature"].tolist() == [0.5, 0.0] and sampling["top_k"].tolist() == [0, 20]
    assert np.allclose(sampling["top_p"], [0.9, 1.0]) and np.allclose(sampling["min_p"], [0.1, 0.0])
    assert sampling["presence_penalty"].tolist() == [0.5, 0.0]
    assert sampling["frequency_penalty"].tolist() == [0.0, -1.0]
    assert sampling["num_logprobs"].tolist() == [-1, -1] and plan.output_pos.tolist() == [0, 0]


def test_schedule_and_update_must_alternate():
    scheduler, runner = make_scheduler()
    add(scheduler, "r", [1, 2, 3])
    plan = scheduler.schedule()
    with pytest.raises(SchedulerError, match="step 0 is still in flight"):
        scheduler.schedule()
    with pytest.raises(SchedulerError, match="result of step 5 was given for step 0"):
        scheduler.update(plan, StepResult(5, 0, np.zeros(1, np.int32)))
    scheduler.update(plan, runner.run(plan))
    with pytest.raises(SchedulerError, match="update\\(\\) for step 0"):
        scheduler.update(plan, runner.run(plan))


def test_the_first_token_reports_the_time_from_arrival_to_admission():
    scheduler, runner = make_scheduler(max_num_seqs=1)
    first = add(scheduler, "first", prompt(0, 5), max_tokens=3, ignore_eos=True)
    second = add(scheduler, "second", prompt(1, 5), max_tokens=2, ignore_eos=True)
    first.arrival_s -= 1.0  # it arrived a second ago
    outcome = drive(scheduler, runner)
    queue = {o.request_id: [x.queue_time_s for x in outcome.outputs if x.request_id == o.request_id]
             for o in outcome.outputs}
    assert queue["first"][0] >= 1.0 and queue["first"][1:] == [None, None]
    # the second waited for the only seat: admitted after the first finished
    assert queue["second"][0] > 0 and queue["second"][1:] == [None]
    assert second.queue_time_s == queue["second"][0]


def test_stats_describe_the_batch():
    scheduler, runner = make_scheduler(max_num_seqs=2)
    requests = [add(scheduler, f"r{i}", prompt(i, 10), max_tokens=5, ignore_eos=True) for i in range(3)]
    outcome = Outcome()
    step(scheduler, runner, outcome)
    stats = scheduler.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_tokens_last_step) == (2, 1, 20)
    assert stats.kv_usage == 6 / 256 and stats.step_id == 1
    drive(scheduler, runner, outcome)
    stats = scheduler.stats()
    assert stats.num_prompt_tokens == 30 and stats.num_generation_tokens == 15
    assert stats.prefix_cache_query_tokens == 30 and stats.kv_usage == 0.0
    assert_reference_tokens(scheduler, outcome, requests)


# --- random workloads ------------------------------------------------------------------------------


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    chunked = draw(st.booleans())
    budget = draw(st.integers(4, 48))
    prefixes = [prompt(900 + i, draw(st.integers(0, 20))) for i in range(2)]
    requests = []
    for i in range(draw(st.integers(1, 8))):
        length = draw(st.integers(1, budget if not chunked else 40))
        tokens = (prefixes[draw(st.integers(0, 1))] + prompt(i, length))[: budget if not chunked else None]
        params = {"max_tokens": draw(st.integers(1, 20)), "min_tokens": 0}
        params["min_tokens"] = draw(st.integers(0, params["max_tokens"]))
        if draw(st.booleans()):
            params.update(temperature=1.0, seed=i)
        requests.append((tokens, params))
    most_pages = max(-(-(len(t) + p["max_tokens"] - 1) // block_size) for t, p in requests)
    config = {
        "block_size": block_size, "chunked": chunked, "max_num_batched_tokens": budget,
        "max_num_seqs": draw(st.integers(1, 6)), "threshold": draw(st.sampled_from([0, 0, 5])),
        "prefix_caching": draw(st.booleans()),
        "num_pages": most_pages + draw(st.sampled_from([0, 1, 2, 4, 8, 64])),  # mostly tight: preemptions
    }
    aborts = draw(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 7)), max_size=3))
    return config, requests, dict(aborts)


@given(workloads())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_workloads_give_reference_tokens_and_leave_the_pool_balanced(workload):
    config, specs, aborts = workload  # aborts: step -> index of the request to abort then
    scheduler, runner = make_scheduler(**config)
    requests = [add(scheduler, f"r{i}", tokens, **{"temperature": 0.0, **params})
                for i, (tokens, params) in enumerate(specs)]
    outcome = Outcome()
    aborted = set()
    for step_index in range(5000):
        if not scheduler.has_unfinished():
            break
        if step_index in aborts and aborts[step_index] < len(requests):
            request = requests[aborts[step_index]]
            if scheduler.abort_request(request.request_id):
                aborted.add(request.request_id)
        step(scheduler, runner, outcome)
    assert_balanced(scheduler)
    assert set(outcome.final) == {r.request_id for r in requests}, "a request was dropped"
    for request in requests:
        if request.request_id in aborted:
            assert outcome.final[request.request_id].finish_reason == "abort"
            want = expected(scheduler, request)
            assert outcome.tokens[request.request_id] == want[: len(outcome.tokens[request.request_id])]
        else:
            assert outcome.tokens[request.request_id] == expected(scheduler, request)


# --- async scheduling: two steps in flight ----------------------------------------------------------


def test_async_decodes_take_their_input_from_the_step_in_flight():
    scheduler, runner = make_scheduler(steps_in_flight=2)
    requests = [add(scheduler, f"r{i}", prompt(i, 5 + i), max_tokens=6, ignore_eos=True) for i in range(3)]
    driver = AsyncDriver(scheduler, runner)
    outcome = driver.drive()
    assert_reference_tokens(scheduler, outcome, requests)
    first, second = driver.plans[:2]
    assert (first.prev_row == -1).all()  # prompts: every input known
    assert second.prev_row.tolist() == [0, 1, 2]  # planned before the first step's tokens came back
    assert (second.input_ids == 0).all() and (second.positions == first.positions[first.logits_index]
                                              + 1).all()
    # every decode after the prompts used a placeholder: the scheduler never waited for a token
    assert all((plan.prev_row >= 0).all() for plan in driver.plans[1:])


def test_async_stops_planning_a_request_whose_pending_token_is_its_last():
    scheduler, runner = make_scheduler(steps_in_flight=2)
    request = add(scheduler, "r", prompt(0, 6), max_tokens=3, ignore_eos=True)
    driver = AsyncDriver(scheduler, runner)
    outcome = driver.drive()
    assert outcome.tokens["r"] == expected(scheduler, request) and len(outcome.tokens["r"]) == 3
    assert len(driver.plans) == 3  # the prompt and two decodes: no step computes a token beyond max_tokens


def test_async_a_stop_token_in_flight_costs_one_void_token_and_no_output():
    scheduler, runner = make_scheduler(steps_in_flight=2)
    tokens = prompt(3, 8)
    script = reference_tokens(tokens, SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True), 0,
                              (), MAX_MODEL_LEN, VOCAB)
    stop = script[2]  # the third token ends it
    request = add(scheduler, "r", tokens, max_tokens=50, stop_token_ids=[stop])
    driver = AsyncDriver(scheduler, runner)
    outcome = driver.drive()
    assert outcome.tokens["r"] == script[:3] and outcome.final["r"].finish_reason == "stop"
    assert len(driver.plans) == 4  # the step after the stop ran, planned before the stop was known
    assert request.num_tokens == len(tokens) + 3


def test_async_preemption_voids_the_victims_chunk_in_flight():
    # Two requests that together outgrow a tight pool: the newer is preempted while its step runs.
    scheduler, runner = make_scheduler(num_pages=10, block_size=4, steps_in_flight=2)
    requests = [add(scheduler, f"r{i}", prompt(i, 10), max_tokens=12, ignore_eos=True) for i in range(2)]
    outcome = AsyncDriver(scheduler, runner).drive()
    assert scheduler.stats().num_preemptions > 0
    assert_reference_tokens(scheduler, outcome, requests)


def test_async_penalized_requests_wait_for_their_token():
    scheduler, runner = make_scheduler(steps_in_flight=2)
    plain = add(scheduler, "plain", prompt(1, 5), max_tokens=6, ignore_eos=True)
    penalized = add(scheduler, "pen", prompt(2, 5), max_tokens=6, ignore_eos=True, repetition_penalty=1.2)
    driver = AsyncDriver(scheduler, runner)
    outcome = driver.drive()
    assert outcome.tokens["plain"] == expected(scheduler, plain)
    assert outcome.tokens["pen"] == expected(scheduler, penalized)
    for plan in driver.plans:  # the penalized request never decodes from a placeholder
        penalized_rows = np.flatnonzero(plan.sampling["repetition_penalty"] != 1.0)
        assert (plan.prev_row[penalized_rows] == -1).all()


def test_async_structured_requests_carry_spec_and_output_and_decode_from_placeholders():
    from core.structured.specs import choice_spec

    spec = choice_spec(["yes", "no"])
    scheduler, runner = make_scheduler(steps_in_flight=2)
    plain = add(scheduler, "plain", prompt(1, 5), max_tokens=6, ignore_eos=True)
    structured = add(scheduler, "json", prompt(2, 5), max_tokens=6, ignore_eos=True, structured_output=spec)
    driver = AsyncDriver(scheduler, runner)
    outcome = driver.drive()
    assert outcome.tokens["plain"] == expected(scheduler, plain)
    assert outcome.tokens["json"] == expected(scheduler, structured)
    seen = placeholders = 0
    for plan in driver.plans:
        rows = np.flatnonzero(np.diff(plan.grammar_start))
        for row in rows.tolist():
            assert plan.logits_index[row] >= 0  # only where it samples
            carried = plan.grammar_spec[plan.grammar_start[row] : plan.grammar_start[row + 1]]
            assert carried.tobytes() == spec.encode()
            history = plan.history_ids[plan.history_start[row] : plan.history_start[row + 1]]
            assert plan.history_prompt_len[row] == 0  # no penalties: the output alone, not the prompt
            # the output ends before the token in flight, which the executor adds
            assert len(history) == plan.output_pos[row] - (plan.prev_row[row] >= 0)
            assert history.tolist() == structured.all_token_ids[5 : 5 + len(history)].tolist()
            placeholders += plan.prev_row[row] >= 0
            seen += 1
    assert seen == 6 and placeholders > 0


def test_async_allows_two_steps_in_flight_and_no_more():
    scheduler, runner = make_scheduler(steps_in_flight=2)
    add(scheduler, "r", [1, 2, 3], max_tokens=10, ignore_eos=True)
    first = scheduler.schedule()
    second = scheduler.schedule()
    with pytest.raises(SchedulerError, match="step 0 is still in flight"):
        scheduler.schedule()
    runner.run(first)
    with pytest.raises(SchedulerError, match="the oldest step in flight is 0"):
        scheduler.update(second, runner.run(second))
    with pytest.raises(SchedulerError, match="must be 1 or 2"):
        make_scheduler(steps_in_flight=3)
    assert first.step_id == 0 and second.step_id == 1


@given(workloads())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_async_random_workloads_give_reference_tokens_and_leave_the_pool_balanced(workload):
    config, specs, aborts = workload
    scheduler, runner = make_scheduler(**config, steps_in_flight=2)
    requests = [add(scheduler, f"r{i}", tokens, **{"temperature": 0.0, **params})
                for i, (tokens, params) in enumerate(specs)]
    driver = AsyncDriver(scheduler, runner)
    outcome = Outcome()
    aborted = set()
    for turn in range(5000):
        if not scheduler.has_unfinished() and not driver.in_flight:
            break
        if turn in aborts and aborts[turn] < len(requests):
            request = requests[aborts[turn]]
            if scheduler.abort_request(request.request_id):
                aborted.add(request.request_id)
        driver.turn(outcome)
    assert_balanced(scheduler)
    assert set(outcome.final) == {r.request_id for r in requests}, "a request was dropped"
    for request in requests:
        got = outcome.tokens[request.request_id]
        if request.request_id in aborted:
            assert outcome.final[request.request_id].finish_reason == "abort"
            assert got == expected(scheduler, request)[: len(got)]
        else:
            assert got == expected(scheduler, request)


# --- CPU time --------------------------------------------------------------------------------------


def measure_decode_step_cpu_time(num_requests: int = 256, context_len: int = 2000, block_size: int = 16,
                                 num_steps: int = 200) -> dict[str, float]:
    """Median microseconds of schedule() and update() with `num_requests` decoding `context_len` contexts."""
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=num_requests, max_num_batched_tokens=8192),
                          CacheConfig(block_size=block_size),
                          num_pages=num_requests * -(-(context_len + num_steps + 64) // block_size),
                          max_model_len=40960, eos_token_ids=(151645,))
    rng = np.random.default_rng(0)
    for i in range(num_requests):
        scheduler.add_request(Request(f"r{i}", rng.integers(0, 150_000, context_len),
                                      SamplingParams(max_tokens=num_steps + 32, temperature=0.7, top_p=0.9)))

    def run_step() -> tuple[StepPlan, float, float]:
        start = time.perf_counter()
        plan = scheduler.schedule()
        scheduled = time.perf_counter()
        result = StepResult(plan.step_id, 0, np.full(plan.num_reqs, 5, np.int32))
        updating = time.perf_counter()
        scheduler.update(plan, result)
        return plan, scheduled - start, time.perf_counter() - updating

    while run_step()[0].num_tokens != num_requests:  # prefill until everyone decodes
        pass
    times = np.array([run_step()[1:] for _ in range(num_steps)]) * 1e6
    schedule_us, update_us = np.median(times, axis=0)
    return {"schedule_us": float(schedule_us), "update_us": float(update_us),
            "total_us": float(np.median(times.sum(axis=1)))}


def test_print_decode_step_cpu_time_for_256_requests_of_2000_tokens(capsys):
    """A measurement, not a check: the machine this runs on decides the numbers."""
    timing = measure_decode_step_cpu_time()
    with capsys.disabled():
        print(f"\nscheduler decode step, 256 x 2000 tokens, block 16: "
              f"schedule {timing['schedule_us']:.0f} us + update {timing['update_us']:.0f} us "
              f"= {timing['total_us']:.0f} us (median)")
