"""A dead replica's requests move to a live one: whatever state they were in, every output they
produce afterwards is valid on the wire and they finish with exactly the tokens of a run that never
moved (greedy and seeded sampling alike), leaving both pools balanced."""

from __future__ import annotations

import pytest
from test_scheduler import (
    AsyncDriver,
    Outcome,
    _reach,
    add,
    assert_balanced,
    assert_reference_tokens,
    drive,
    make_scheduler,
    mixed_workload,
    prompt,
    step,
)

from core.scheduling.request import RequestStatus
from ipc.codec import decode, encode
from ipc.messages import TokenDeltas


def _move(dead, live):
    """What the scheduler process does when a replica goes down: evacuate, then adopt elsewhere."""
    orphans = dead.evacuate()
    for request in orphans:
        live.adopt(request)
    return orphans


def _assert_wire_valid(outcome: Outcome) -> None:
    """Every output survives the codec as the tokenizer would receive it (issue: a None field
    failed the whole TokenDeltas message and every stream in it hung)."""
    if outcome.outputs:
        assert decode(encode(TokenDeltas(outcome.outputs))).outputs == outcome.outputs
    for output in outcome.outputs:
        assert isinstance(output.num_cached_tokens, int)


@pytest.mark.parametrize("state", ["waiting", "mid-prefill", "decoding", "preempted"])
def test_a_moved_request_finishes_with_the_tokens_of_an_unmoved_run(state):
    dead, dead_runner, outcome, victim, others = _reach(state)
    live, live_runner = make_scheduler()
    bystander = add(live, "bystander", prompt(40, 9), max_tokens=6)
    orphans = _move(dead, live)
    assert victim in orphans and all(r.status is RequestStatus.PREEMPTED for r in orphans)
    outcome = drive(live, live_runner, outcome)
    assert_reference_tokens(live, outcome, [victim, *others, bystander])
    _assert_wire_valid(outcome)


def test_a_request_moved_before_it_ever_ran_reports_its_cache_hit_and_queue_time():
    dead, _ = make_scheduler()
    live, runner = make_scheduler()
    shared = prompt(7, 24)
    add(live, "warm", shared + [1], max_tokens=2)
    outcome = drive(live, runner)
    moved = add(dead, "moved", shared + [2, 3], max_tokens=3)
    _move(dead, live)
    outcome = drive(live, runner, outcome)
    first = next(o for o in outcome.outputs if o.request_id == "moved")
    assert first.num_cached_tokens == 24 and first.queue_time_s is not None
    assert_reference_tokens(live, outcome, [moved])
    _assert_wire_valid(outcome)


@pytest.mark.parametrize("turns", [1, 2, 3, 5, 8])
def test_async_moved_requests_with_placeholders_in_flight_finish_exactly(turns):
    dead, dead_runner = make_scheduler(num_pages=40, steps_in_flight=2)
    requests = mixed_workload(dead, 10)
    driver = AsyncDriver(dead, dead_runner)
    outcome = Outcome()
    for _ in range(turns):
        driver.turn(outcome)
    assert driver.in_flight  # the dead replica had steps running whose results never come
    live, live_runner = make_scheduler(num_pages=40, steps_in_flight=2)
    _move(dead, live)
    outcome = AsyncDriver(live, live_runner).drive(outcome)
    assert_reference_tokens(live, outcome, requests)
    _assert_wire_valid(outcome)
    assert_balanced(live)


def test_a_replica_that_takes_every_request_of_a_dead_one_under_a_small_pool_preempts_and_finishes():
    dead, dead_runner = make_scheduler()
    requests = mixed_workload(dead, 12)
    outcome = Outcome()
    for _ in range(6):
        step(dead, dead_runner, outcome)
    live, live_runner = make_scheduler(num_pages=24)
    _move(dead, live)
    outcome = drive(live, live_runner, outcome)
    assert live.stats().num_preemptions > 0
    assert_reference_tokens(live, outcome, requests)
    _assert_wire_valid(outcome)
