"""A waiting request whose prompt a prefill in flight is computing waits for those pages instead of
computing them again beside it (core/scheduling/prefills_in_flight.py), and lets the requests
behind it go first. Driven by tests/fake_runner.py, tokens checked against the reference."""

from __future__ import annotations

from test_scheduler import (
    AsyncDriver,
    Outcome,
    add,
    assert_reference_tokens,
    drive,
    make_scheduler,
    prompt,
    step,
)

from core.scheduling.request import RequestStatus

SYSTEM = prompt(100, 128)  # two 64-token chunks at block size 4


def member(seed: int) -> list[int]:
    return prompt(seed, 6, prefix=SYSTEM)


def test_a_group_admitted_together_computes_its_prefix_once():
    scheduler, runner = make_scheduler(max_num_batched_tokens=512)
    group = [add(scheduler, f"g{i}", member(i), max_tokens=4, ignore_eos=True) for i in range(4)]
    other = add(scheduler, "other", prompt(9, 134), max_tokens=4, ignore_eos=True)
    outcome = Outcome()
    plan = step(scheduler, runner, outcome)
    # the first of the group and the unrelated prompt behind the rest of it
    assert plan.num_reqs == 2 and plan.num_tokens == 134 + 134
    assert [r.status for r in group[1:]] == [RequestStatus.WAITING] * 3
    assert other.status is RequestStatus.RUNNING
    plan = step(scheduler, runner, outcome)  # the rest, each from the prefix the first one wrote
    assert all(r.num_cached_tokens == 128 for r in group[1:])
    assert scheduler.stats().prefix_cache_hit_tokens == 3 * 128
    assert_reference_tokens(scheduler, drive(scheduler, runner, outcome), [*group, other])


def test_unrelated_prompts_and_short_shared_prefixes_are_not_held_back():
    scheduler, runner = make_scheduler(max_num_batched_tokens=512)
    # 60 shared tokens: less than a chunk, not worth a step's wait
    short = [add(scheduler, f"s{i}", prompt(i, 70, prefix=SYSTEM[:60]), max_tokens=2) for i in range(2)]
    unrelated = [add(scheduler, f"u{i}", prompt(20 + i, 130), max_tokens=2) for i in range(2)]
    plan = step(scheduler, runner, Outcome())
    assert plan.num_reqs == 4
    assert all(r.status is RequestStatus.RUNNING for r in short + unrelated)


def test_a_request_that_scores_its_prompt_does_not_wait_for_pages_it_cannot_use():
    scheduler, runner = make_scheduler(max_num_batched_tokens=512)
    first = add(scheduler, "first", member(0), max_tokens=2)
    scored = add(scheduler, "scored", member(1), max_tokens=2, prompt_logprobs=1)
    plan = step(scheduler, runner, Outcome())
    assert plan.num_reqs == 2 and first.status is scored.status is RequestStatus.RUNNING


def test_without_prefix_caching_nobody_waits():
    scheduler, runner = make_scheduler(max_num_batched_tokens=512, prefix_caching=False)
    for i in range(3):
        add(scheduler, f"g{i}", member(i), max_tokens=4, ignore_eos=True)
    plan = step(scheduler, runner, Outcome())
    assert plan.num_reqs == 3


def test_a_chunked_prefill_holds_its_group_until_its_pages_are_written():
    scheduler, runner = make_scheduler(max_num_batched_tokens=64)  # the first prompt takes 3 steps
    group = [add(scheduler, f"g{i}", member(i), max_tokens=3, ignore_eos=True) for i in range(3)]
    outcome = Outcome()
    step(scheduler, runner, outcome)
    step(scheduler, runner, outcome)
    assert [r.status for r in group[1:]] == [RequestStatus.WAITING] * 2
    assert_reference_tokens(scheduler, drive(scheduler, runner, outcome), group)
    assert all(r.num_cached_tokens == 128 for r in group[1:])


def test_with_a_step_in_flight_the_group_waits_for_its_result():
    scheduler, runner = make_scheduler(max_num_batched_tokens=512, steps_in_flight=2)
    group = [add(scheduler, f"g{i}", member(i), max_tokens=5, ignore_eos=True) for i in range(4)]
    driver = AsyncDriver(scheduler, runner)
    outcome = driver.drive()
    assert_reference_tokens(scheduler, outcome, group)
    assert all(r.num_cached_tokens == 128 for r in group[1:])
    assert driver.plans[0].num_reqs == 1


def test_a_step_looks_at_most_64_requests_past_those_that_wait():
    scheduler, runner = make_scheduler(max_num_batched_tokens=4096, max_num_seqs=128, num_pages=4096)
    group = [add(scheduler, f"g{i}", member(i), max_tokens=2) for i in range(100)]
    later = add(scheduler, "later", prompt(7, 130), max_tokens=2)
    outcome = Outcome()
    plan = step(scheduler, runner, outcome)
    # the scheduler looks 64 requests past the head: "later" is the 101st, so it waits this step
    assert plan.num_reqs == 1 and later.status is RequestStatus.WAITING
    assert_reference_tokens(scheduler, drive(scheduler, runner, outcome), [*group, later])
