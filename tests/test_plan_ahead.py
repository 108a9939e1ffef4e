"""When async scheduling plans the step behind the running one (core/scheduling/plan_ahead.py),
on a fake clock."""

import pytest

from core.scheduling.plan_ahead import PlanAhead


def test_a_step_size_never_seen_plans_at_once():
    ahead = PlanAhead(slack_fraction=0.1, min_slack_s=0.004)
    assert ahead.expected_s(256) is None
    assert ahead.plan_next_at(100.0, 256) == 100.0
    ahead.step_sent(100.0, 256, steps_before=0)
    assert ahead.may_plan(100.0, steps_in_flight=1)


def test_the_next_plan_waits_for_most_of_the_expected_step():
    ahead = PlanAhead(slack_fraction=0.1, min_slack_s=0.004)
    ahead.step_done(10.0, 256, 0.030, running_num_tokens=None)
    assert ahead.expected_s(256) == pytest.approx(0.030)
    assert ahead.plan_next_at(100.0, 256) == pytest.approx(100.0 + 0.030 - 0.004)  # the least slack
    ahead.step_done(10.0, 8192, 0.360, running_num_tokens=None)
    assert ahead.plan_next_at(100.0, 8192) == pytest.approx(100.0 + 0.9 * 0.360)  # a tenth of a long step


def test_steps_shorter_than_the_slack_plan_at_once():
    ahead = PlanAhead(slack_fraction=0.1, min_slack_s=0.004)
    ahead.step_done(0.0, 1, 0.003, running_num_tokens=None)
    assert ahead.plan_next_at(5.0, 1) == 5.0


def test_size_classes_are_a_quarter_of_a_power_of_two_and_kept_apart():
    ahead = PlanAhead()
    ahead.step_done(0.0, 300, 0.035, None)  # a decode of 300 requests
    ahead.step_done(0.0, 8192, 0.360, None)  # a step full of prefill
    assert ahead.expected_s(256) == pytest.approx(0.035)  # 256 .. 319 share a class
    assert ahead.expected_s(319) == pytest.approx(0.035)
    assert ahead.expected_s(320) is None
    assert ahead.expected_s(8000) is None
    assert ahead.expected_s(8192) == pytest.approx(0.360)
    assert PlanAhead.size_class(0) == PlanAhead.size_class(1)
    classes = [PlanAhead.size_class(n) for n in range(1, 5000)]
    assert classes == sorted(classes)  # never decreasing
    for n in (5, 64, 100, 1784, 4095):
        same = [m for m in range(1, 9000) if PlanAhead.size_class(m) == PlanAhead.size_class(n)]
        assert max(same) - min(same) + 1 <= max(1, min(same) // 4)


def test_steps_that_vary_plan_earlier_by_twice_their_spread():
    ahead = PlanAhead(slack_fraction=0.1, min_slack_s=0.004)
    for seconds in (0.100, 0.120, 0.100, 0.120, 0.100, 0.120):
        ahead.step_done(0.0, 4096, seconds, None)
    steady = PlanAhead(slack_fraction=0.1, min_slack_s=0.004)
    for _ in range(6):
        steady.step_done(0.0, 4096, 0.110, None)
    mean = ahead.expected_s(4096)
    assert 0.100 < mean < 0.120
    assert ahead.plan_next_at(0.0, 4096) < steady.plan_next_at(0.0, 4096) - 0.010
    assert ahead.plan_next_at(0.0, 4096) < 0.100 - 0.010  # even the short steps keep their slack


def test_the_estimate_follows_the_recent_steps():
    ahead = PlanAhead()
    ahead.step_done(0.0, 64, 0.010, None)
    for _ in range(30):
        ahead.step_done(0.0, 64, 0.020, None)  # contexts grew: the steps got slower
    assert ahead.expected_s(64) == pytest.approx(0.020, rel=1e-3)
    ahead.step_done(0.0, 64, None, None)  # no measurement (a failed step): ignored
    ahead.step_done(0.0, 64, 0.0, None)
    assert ahead.expected_s(64) == pytest.approx(0.020, rel=1e-3)


def test_two_steps_in_flight_the_second_planned_late_in_the_first():
    """Decode steps of 10 ms: step A goes out on an idle device, step B is planned 6 ms into A
    (10 less the 4 ms of least slack), A's result starts the clock for B, and so on."""
    ahead = PlanAhead(slack_fraction=0.1, min_slack_s=0.004)
    ahead.step_done(0.0, 32, 0.010, None)  # learnt from an earlier step
    ahead.step_sent(1.000, 32, steps_before=0)  # A: the device was idle, A starts now
    assert ahead.may_plan(1.000, steps_in_flight=0)  # nothing in flight: always
    assert not ahead.may_plan(1.001, steps_in_flight=1)
    assert ahead.seconds_until_plan(1.001) == pytest.approx(0.005)
    assert ahead.may_plan(1.006, steps_in_flight=1)
    ahead.step_sent(1.006, 32, steps_before=1)  # B behind A: the clock stays with A
    assert ahead.seconds_until_plan(1.006) == 0.0
    ahead.step_done(1.010, 32, 0.010, running_num_tokens=32)  # A back; B runs from now
    assert not ahead.may_plan(1.012, steps_in_flight=1)
    assert ahead.may_plan(1.016, steps_in_flight=1)


def test_with_nothing_to_plan_it_waits_for_the_running_steps_result_or_new_work():
    ahead = PlanAhead()
    ahead.step_sent(1.0, 1, steps_before=0)
    ahead.nothing_to_plan()
    assert not ahead.may_plan(1e9, steps_in_flight=1)
    assert ahead.seconds_until_plan(2.0) == float("inf")
    assert ahead.may_plan(1e9, steps_in_flight=0)
    ahead.work_arrived()  # a request came: it may go behind the running step
    assert ahead.may_plan(1.0, steps_in_flight=1)
    ahead.nothing_to_plan()
    ahead.step_done(2.0, 1, 0.008, running_num_tokens=None)  # its result: nothing runs now
    assert ahead.may_plan(2.0, steps_in_flight=0)


def test_new_work_waits_for_the_planned_time_like_the_rest():
    ahead = PlanAhead(slack_fraction=0.1, min_slack_s=0.004)
    ahead.step_done(0.0, 32, 0.010, None)
    ahead.step_sent(1.000, 32, steps_before=0)
    ahead.nothing_to_plan()
    ahead.work_arrived()
    assert not ahead.may_plan(1.002, steps_in_flight=1)  # too early still: 6 ms into the step
    assert ahead.may_plan(1.006, steps_in_flight=1)
