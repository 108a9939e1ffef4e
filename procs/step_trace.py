"""The scheduler's step trace: every arrival, plan and result with its monotonic time, at DEBUG.

`cadence serve --log-level debug` (or CADENCE_LOG_LEVEL=DEBUG) turns it on; it is how a stalled
loop shows itself (a gap between sends while requests arrive). Off, each call costs one level check.
Used by procs/scheduler_proc.py.
"""

from __future__ import annotations

import logging
import time

from core.plan import StepPlan
from core.scheduling.scheduler import Scheduler


class StepTrace:
    def __init__(self, log: logging.Logger) -> None:
        self.log = log

    def arrived(self, request_id: str, replica: int, num_prompt_tokens: int, cached: int) -> None:
        """A request was routed; `cached`: prompt tokens the replica's prefix cache holds (the router's
        work is the uncached prompt plus the tokens left to generate)."""
        if self.log.isEnabledFor(logging.DEBUG):
            self.log.debug("request %s on replica %d at %.4f: %d prompt tokens, %d cached", request_id,
                           replica, time.monotonic(), num_prompt_tokens, cached)

    def sent(self, replica: int, plan: StepPlan, sent_s: float, steps_before: int,
             scheduler: Scheduler) -> None:
        if self.log.isEnabledFor(logging.DEBUG):
            self.log.debug("replica %d step %d sent at %.4f: %d requests, %d tokens, %d waiting, "
                           "%d running, %d in flight before", replica, plan.step_id, sent_s, plan.num_reqs,
                           plan.num_tokens, len(scheduler.waiting), len(scheduler.running), steps_before)

    def done(self, replica: int, step_id: int, execute_ms: float | None) -> None:
        if self.log.isEnabledFor(logging.DEBUG):
            self.log.debug("replica %d step %d done at %.4f: executed %s ms", replica, step_id,
                           time.monotonic(), "?" if execute_ms is None else f"{execute_ms:.1f}")
