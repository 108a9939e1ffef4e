"""One load run: requests sent on their arrival schedule, at most --max-concurrency in flight, each
one's timing kept, and the server's gauges sampled meanwhile.

`python -m benchmarks.load` and `python -m benchmarks.fault_drill` drive it; load_summary.py turns
what it kept into the report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import time

import numpy as np

from benchmarks.lib.backends import RequestTiming, ServerGauges
from benchmarks.lib.datasets import RequestSpec

_GAUGE_EVERY_S = 0.5


class LoadRun:
    """One run: arrivals, the concurrency limit, per-request timings and gauge samples."""

    def __init__(self, args: argparse.Namespace, backend) -> None:
        self.args = args
        self.backend = backend
        self.limit = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
        self.in_flight = 0
        self.max_in_flight = 0
        self.timings: list[tuple[RequestSpec, RequestTiming]] = []
        self.gauges: list[tuple[float, ServerGauges]] = []
        self.progress = None

    async def send(self, spec: RequestSpec, history: list[dict] | None = None) -> RequestTiming:
        if self.limit is not None:
            await self.limit.acquire()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            timing = await self.backend.send(spec, history)
        finally:
            self.in_flight -= 1
            if self.limit is not None:
                self.limit.release()
        self.timings.append((spec, timing))
        if self.progress is not None:
            self.progress.update(1)
        return timing

    async def conversation(self, turns: list[RequestSpec]) -> None:
        history: list[dict] = []
        for spec in turns:
            history.append({"role": "user", "content": spec.question})
            timing = await self.send(spec, list(history))
            if not timing.ok:
                return
            history.append({"role": "assistant", "content": timing.text})

    async def sample_gauges(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            gauges = await self.backend.gauges()
            if gauges is not None:
                self.gauges.append((time.perf_counter(), gauges))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _GAUGE_EVERY_S)

    async def run(self, specs: list[RequestSpec]) -> float:
        """Send every request on its arrival schedule; returns the run's duration in seconds."""
        units: list[list[RequestSpec]] = _units(specs)
        rng = np.random.default_rng(self.args.seed + 1)
        rate = self.args.request_rate
        stop = asyncio.Event()
        sampler = asyncio.create_task(self.sample_gauges(stop))
        start = time.perf_counter()
        tasks = []
        for unit in units:
            if len(unit) == 1 and unit[0].question is None:
                tasks.append(asyncio.create_task(self.send(unit[0])))
            else:
                tasks.append(asyncio.create_task(self.conversation(unit)))
            if math.isfinite(rate):
                shape = self.args.burstiness
                await asyncio.sleep(rng.gamma(shape, 1.0 / (rate * shape)))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        stop.set()
        await sampler
        return duration


def _units(specs: list[RequestSpec]) -> list[list[RequestSpec]]:
    """Requests that arrive on their own, and conversations whose turns run in order."""
    conversations: dict[int, list[RequestSpec]] = {}
    units = []
    for spec in specs:
        if spec.conversation < 0:
            units.append([spec])
        else:
            if spec.conversation not in conversations:
                conversations[spec.conversation] = []
                units.append(conversations[spec.conversation])
            conversations[spec.conversation].append(spec)
    return units
