"""When async scheduling plans the step that goes behind the one running.

Planning step N+1 the moment step N starts keeps the GPU busy, but it freezes N+1's batch a whole
step early: a request that arrives while N runs cannot join N+1 and waits for N+2, one step more
than with one step at a time. Under load the steps carry long prefill chunks (hundreds of
milliseconds): on an H200, planning at once raised the median time to first token of the
shared-prefix workload's later requests (those sent after the first 256) from 267 to 846 ms.
So the scheduler plans N+1 shortly before N is expected to end: late enough that arrivals during
most of N join N+1, early enough that N+1 is on the device before N finishes.

The expected duration of a step comes from the recent steps of the same size class (its token
count to within a quarter: four classes per power of two): exponential averages of the executor's
measured time and of its spread. An estimate that runs short only plans early; one that runs long
leaves the GPU idle for the difference (`cadence:step_wait_seconds` shows it), so the plan goes
out at the average less twice the spread, less the slack. A class never seen plans at once, as
before. Used by procs/scheduler_proc.py, one per replica.
"""

from __future__ import annotations

import math

# What to leave of the running step's expected time for planning, the broadcast and the executor's
# launch (well under a millisecond for a decode graph, a few for an eager prefill step) and for the
# step being shorter than expected: a tenth of it, and never less than MIN_SLACK_S.
SLACK_FRACTION = 0.1
MIN_SLACK_S = 0.004
SMOOTHING = 0.3  # weight of the newest step in the averages
SPREADS = 2.0  # how many average deviations below the average a step may end without idling the GPU


class PlanAhead:
    """One replica's clock for planning: fed the steps sent and done, asked whether to plan now."""

    def __init__(self, slack_fraction: float = SLACK_FRACTION, min_slack_s: float = MIN_SLACK_S) -> None:
        self.slack_fraction = slack_fraction
        self.min_slack_s = min_slack_s
        self._expected_s: dict[int, float] = {}  # size class -> average seconds
        self._spread_s: dict[int, float] = {}  # size class -> average absolute deviation
        self._plan_at = 0.0  # monotonic seconds: when to plan the step behind the running one
        self._nothing_to_plan = False  # the scheduler had nothing for it: wait for new work or a result

    @staticmethod
    def size_class(num_tokens: int) -> int:
        """The power of two at or below num_tokens and the next two bits: a class is at most a quarter
        of its smallest size wide."""
        num_tokens = max(1, num_tokens)
        octave = num_tokens.bit_length() - 1
        return octave * 4 + ((num_tokens << 2) >> octave & 3)

    def expected_s(self, num_tokens: int) -> float | None:
        return self._expected_s.get(self.size_class(num_tokens))

    def plan_next_at(self, started_s: float, num_tokens: int) -> float:
        """When to plan the step behind one of `num_tokens` tokens that started on the device at
        `started_s` (monotonic seconds)."""
        key = self.size_class(num_tokens)
        expected = self._expected_s.get(key)
        if expected is None:
            return started_s
        shortest_likely = expected - SPREADS * self._spread_s[key]
        slack = max(self.min_slack_s, self.slack_fraction * expected)
        return started_s + max(0.0, shortest_likely - slack)

    # --- fed by the scheduler process ------------------------------------------------------------
    def step_sent(self, now: float, num_tokens: int, steps_before: int) -> None:
        """A step went out; with no step before it in flight, the device starts it now."""
        if steps_before == 0:
            self._plan_at = self.plan_next_at(now, num_tokens)
            self._nothing_to_plan = False

    def step_done(self, now: float, num_tokens: int, device_s: float | None,
                  running_num_tokens: int | None) -> None:
        """A step's result came back after `device_s` on the device; the step queued behind it, if
        any (`running_num_tokens`), started about now."""
        if device_s is not None and device_s > 0:
            key = self.size_class(num_tokens)
            old = self._expected_s.get(key)
            if old is None:
                self._expected_s[key], self._spread_s[key] = device_s, 0.0
            else:
                self._expected_s[key] = old + SMOOTHING * (device_s - old)
                self._spread_s[key] += SMOOTHING * (abs(device_s - old) - self._spread_s[key])
        if running_num_tokens is not None:
            self._plan_at = self.plan_next_at(now, running_num_tokens)
        self._nothing_to_plan = False

    def nothing_to_plan(self) -> None:
        """The scheduler had no step to add behind the running one: wait for its result or new work."""
        self._nothing_to_plan = True

    def work_arrived(self) -> None:
        """A request was added: if its time has come, the step behind the running one may take it."""
        self._nothing_to_plan = False

    # --- asked by the scheduler process ----------------------------------------------------------
    def may_plan(self, now: float, steps_in_flight: int) -> bool:
        return steps_in_flight == 0 or (not self._nothing_to_plan and now >= self._plan_at)

    def seconds_until_plan(self, now: float) -> float:
        return math.inf if self._nothing_to_plan else max(0.0, self._plan_at - now)
