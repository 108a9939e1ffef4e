"""The load tool's server gauges survive a missed scrape: both backends ask again (up to
_GAUGE_ATTEMPTS times) before a run goes without its hit rate, and give up cleanly after."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from benchmarks.lib import backends
from benchmarks.lib.backends import HttpBackend, ServerGauges, ZmqBackend


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    monkeypatch.setattr(backends, "_GAUGE_RETRY_S", 0.0)


class _FlakyServerInfo:
    """A native client whose server_info fails `misses` times, then answers."""

    def __init__(self, misses: int) -> None:
        self.misses, self.calls = misses, 0

    async def server_info(self):
        self.calls += 1
        if self.calls <= self.misses:
            raise TimeoutError("no answer from the tokenizer")
        stats = SimpleNamespace(kv_usage=0.25, prefix_cache_query_tokens=100, prefix_cache_hit_tokens=80,
                                num_running=3)
        replica = SimpleNamespace(stats=stats, step_execute_s=1.5, step_wait_s=0.5)
        return SimpleNamespace(replicas=[replica, replica])


def _zmq_backend(client) -> ZmqBackend:
    backend = ZmqBackend.__new__(ZmqBackend)
    backend._client = client
    return backend


@pytest.mark.parametrize("misses", [0, 1, backends._GAUGE_ATTEMPTS - 1])
def test_native_gauges_are_asked_again_after_a_missed_answer(misses):
    client = _FlakyServerInfo(misses)
    gauges = asyncio.run(_zmq_backend(client).gauges())
    assert gauges == ServerGauges(0.25, 200, 160, 6, 3.0, 1.0)
    assert client.calls == misses + 1


def test_native_gauges_give_up_after_every_attempt_missed():
    client = _FlakyServerInfo(misses=backends._GAUGE_ATTEMPTS)
    assert asyncio.run(_zmq_backend(client).gauges()) is None
    assert client.calls == backends._GAUGE_ATTEMPTS


def test_http_gauges_are_scraped_again_after_a_missed_scrape():
    backend = HttpBackend.__new__(HttpBackend)
    paths = []
    samples = {"cadence:prefix_cache_queries_total": [50.0, 50.0],
               "cadence:prefix_cache_hits_total": [40.0, 0.0],
               "cadence:kv_cache_usage_perc": [0.5, 0.25],
               "cadence:num_requests_running": [2.0, 1.0]}

    async def scrape(path):
        paths.append(path)
        return samples if len(paths) > 2 else None  # /metrics and /engine_metrics both miss once

    backend._metric_samples = scrape
    gauges = asyncio.run(backend.gauges())
    assert paths == ["/metrics", "/engine_metrics", "/metrics"]
    assert gauges.prefix_cache_queries == 100 and gauges.prefix_cache_hits == 40
    assert gauges.kv_cache_usage == pytest.approx(0.375) and gauges.num_running == 3
