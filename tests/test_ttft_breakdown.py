"""benchmarks/ttft_breakdown.py reads the scheduler's step trace as procs/step_trace.py writes it."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from benchmarks.ttft_breakdown import breakdown, read_trace
from procs import step_trace
from procs.step_trace import StepTrace


def _trace_lines(monkeypatch, caplog) -> list[str]:
    """One request at concurrency 1 as the scheduler traces it: routed at 10.002, its 1,784-token
    prefill sent at 10.0025 and back at 10.0540 (executed 51.0 ms), a decode after it."""
    clock = iter([10.002, 10.054, 10.061])
    monkeypatch.setattr(step_trace.time, "monotonic", lambda: next(clock))
    log = logging.getLogger("cadence.test_step_trace")
    trace = StepTrace(log)
    scheduler = SimpleNamespace(waiting=[], running=[object()])
    with caplog.at_level(logging.DEBUG, logger=log.name):
        trace.arrived("abc/cmpl-1-0", 0, 1784, 0)
        trace.sent(0, SimpleNamespace(step_id=7, num_reqs=1, num_tokens=1784), 10.0025, 0, scheduler)
        trace.sent(0, SimpleNamespace(step_id=8, num_reqs=1, num_tokens=1), 10.0026, 1, scheduler)
        trace.done(0, 7, 51.0)
        trace.done(0, 8, 6.1)
    return [record.getMessage() for record in caplog.records]


def test_a_request_splits_into_its_processes_phases(monkeypatch, caplog):
    arrivals, sent, done = read_trace(_trace_lines(monkeypatch, caplog))
    assert arrivals == [(10.002, 1784)]
    assert sent[(0, 7)] == (10.0025, 1784) and done[(0, 7)] == (10.054, 51.0)
    requests = [{"sent_monotonic_s": 10.0, "ttft_ms": 55.0},  # first token at the client at 10.055
                {"sent_monotonic_s": 11.0, "ttft_ms": None}]  # failed: no first token, no row
    (row,) = breakdown(requests, arrivals, sent, done)
    assert row["to_scheduler"] == pytest.approx(2.0) and row["to_plan"] == pytest.approx(0.5)
    assert row["step"] == pytest.approx(51.5) and row["to_client"] == pytest.approx(1.0)
    assert row["executed"] == 51.0 and row["host"] == pytest.approx(4.0)  # 55 - 51: the server's share
    assert sum(row[k] for k in ("to_scheduler", "to_plan", "step", "to_client")) == pytest.approx(55.0)


def test_a_request_the_trace_does_not_hold_has_no_row(monkeypatch, caplog):
    arrivals, sent, done = read_trace(_trace_lines(monkeypatch, caplog))
    assert breakdown([{"sent_monotonic_s": 20.0, "ttft_ms": 5.0}], arrivals, sent, done) == []
