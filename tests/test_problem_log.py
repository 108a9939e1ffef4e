"""A problem that repeats is logged once, then counted: a flood of bad messages is one line plus a
count per interval, never a line per message."""

from __future__ import annotations

import logging

from procs.problem_log import ProblemLog


def test_repeats_are_counted_and_summed_up_once_per_interval(caplog, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("procs.problem_log.time.monotonic", lambda: clock[0])
    problems = ProblemLog(logging.getLogger("test.problems"), every_s=10.0)
    with caplog.at_level(logging.WARNING, logger="test.problems"):
        for i in range(256):
            problems.warning("bad message on channel x", f"item {i}")
        assert len(caplog.records) == 1 and "item 0" in caplog.text
        clock[0] += 11
        problems.flush()
        assert len(caplog.records) == 2 and "255 more" in caplog.records[1].getMessage()
        assert "item 255" in caplog.records[1].getMessage()
        problems.flush()
        problems.warning("another kind", "first of its kind")
    assert len(caplog.records) == 3 and problems.total == 257
