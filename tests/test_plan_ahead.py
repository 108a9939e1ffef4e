"""When async scheduling plans the step behind the running one (core/plan_ahead.py)."""

import pytest

from core.plan_ahead import PlanAhead


def test_a_step_size_never_seen_plans_at_once():
    ahead = PlanAhead(wait_fraction=0.8, launch_margin_s=0.002)
    assert ahead.expected_s(256) is None
    assert ahead.plan_next_at(100.0, 256) == 100.0


def test_the_next_plan_waits_for_most_of_the_expected_step():
    ahead = PlanAhead(wait_fraction=0.8, launch_margin_s=0.002)
    ahead.observe(256, 0.030)
    assert ahead.expected_s(256) == pytest.approx(0.030)
    assert ahead.plan_next_at(100.0, 256) == pytest.approx(100.0 + 0.8 * 0.030 - 0.002)


def test_steps_shorter_than_the_margin_plan_at_once():
    ahead = PlanAhead(wait_fraction=0.8, launch_margin_s=0.002)
    ahead.observe(1, 0.001)
    assert ahead.plan_next_at(5.0, 1) == 5.0


def test_size_classes_are_powers_of_two_and_kept_apart():
    ahead = PlanAhead()
    ahead.observe(300, 0.035)  # a decode of 300 requests
    ahead.observe(8192, 0.360)  # a step full of prefill
    assert ahead.expected_s(256) == pytest.approx(0.035)  # 256 .. 511 share a class
    assert ahead.expected_s(511) == pytest.approx(0.035)
    assert ahead.expected_s(512) is None
    assert ahead.expected_s(8000) is None  # 4096 .. 8191
    assert ahead.expected_s(8192) == pytest.approx(0.360)
    assert PlanAhead.size_class(0) == PlanAhead.size_class(1)


def test_the_estimate_follows_the_recent_steps():
    ahead = PlanAhead()
    ahead.observe(64, 0.010)
    for _ in range(30):
        ahead.observe(64, 0.020)  # contexts grew: the steps got slower
    assert ahead.expected_s(64) == pytest.approx(0.020, rel=1e-3)
    ahead.observe(64, 0.0)  # no measurement (a failed step): ignored
    assert ahead.expected_s(64) == pytest.approx(0.020, rel=1e-3)
