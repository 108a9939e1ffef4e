"""The scheduler's step trace logs arrivals, sends and results at DEBUG, and nothing above it."""

from __future__ import annotations

import logging

import numpy as np

from core.config import CacheConfig, SchedulerConfig
from core.sampling_params import SamplingParams
from core.scheduling.request import Request
from core.scheduling.scheduler import Scheduler
from procs.step_trace import StepTrace


def test_trace_lines_at_debug_and_silence_above(caplog):
    log = logging.getLogger("test.step_trace")
    trace = StepTrace(log)
    scheduler = Scheduler(SchedulerConfig(), CacheConfig(), num_pages=64, max_model_len=512,
                          eos_token_ids=(0,))
    scheduler.add_request(Request("a", np.arange(1, 21), SamplingParams(max_tokens=4)))
    plan = scheduler.schedule()
    with caplog.at_level(logging.INFO, logger=log.name):
        trace.arrived("a", 0, 20, 16)
        trace.sent(0, plan, 1.5, 0, scheduler)
        trace.done(0, plan.step_id, 3.25)
    assert caplog.records == []
    with caplog.at_level(logging.DEBUG, logger=log.name):
        trace.arrived("a", 0, 20, 16)
        trace.sent(0, plan, 1.5, 0, scheduler)
        trace.done(0, plan.step_id, 3.25)
        trace.done(0, plan.step_id, None)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("request a on replica 0 at ")
    assert lines[0].endswith(": 20 prompt tokens, 16 cached")
    assert lines[1] == ("replica 0 step 0 sent at 1.5000: 1 requests, 20 tokens, 0 waiting, 1 running, "
                        "0 in flight before")
    assert lines[2].endswith("executed 3.2 ms")  # 3.25 rounds half to even
    assert lines[3].endswith("executed ? ms")
