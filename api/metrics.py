"""The server's Prometheus metrics, under vLLM's names with the `cadence:` prefix.

Two sources, one registry per app (so several apps in one process never collide):

* engine state, read from the latest ServerInfo when /metrics is scraped, per replica (labels
  model_name, replica): gauges num_requests_running, num_requests_waiting, kv_cache_usage_perc
  (a fraction, 0..1, as in vLLM), replica_up; counters prefix_cache_queries and prefix_cache_hits
  (tokens), num_preemptions, prompt_tokens, generation_tokens, and Cadence's own step_execute_seconds
  and step_wait_seconds (the executor's time running steps and waiting for the next plan between
  back-to-back steps; their ratio is the GPU's idle share), all exposed with `_total`.
* request timings, observed in the api process (label model_name; the api does not learn which
  replica ran a request): histograms time_to_first_token_seconds, inter_token_latency_seconds,
  e2e_request_latency_seconds, request_queue_time_seconds (arrival at the tokenizer to the
  scheduler's first admission, measured by the scheduler and carried with the first token), and the
  counter request_success (label finished_reason).

api/server.py owns one ApiMetrics; each choice of an API call gets a RequestTiming.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ipc.messages import ServerInfo

PREFIX = "cadence:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
                    10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_REQUEST_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                    120.0, 240.0, 480.0, 960.0, 1920.0)


class ApiMetrics:
    def __init__(self, model_name: str) -> None:
        # No `_created` series: vLLM has none, and dashboards built on its names do not expect them.
        # A process-wide switch; the api process has no other Prometheus metrics.
        disable_created_metrics()
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.time_to_first_token = self._histogram(
            "time_to_first_token_seconds", "Time from the API receiving a request to its first token.",
            _LATENCY_BUCKETS)
        self.inter_token_latency = self._histogram(
            "inter_token_latency_seconds", "Time between a request's consecutive tokens.", _LATENCY_BUCKETS)
        self.e2e_request_latency = self._histogram(
            "e2e_request_latency_seconds", "Time from the API receiving a request to its last token.",
            _REQUEST_BUCKETS)
        self.request_queue_time = self._histogram(
            "request_queue_time_seconds",
            "Time a request waited from its arrival to its first admission by the scheduler.",
            _REQUEST_BUCKETS)
        self._request_success = Counter(
            f"{PREFIX}request_success", "Requests finished, by finish reason.",
            ["model_name", "finished_reason"], registry=self.registry)
        self._engine = _EngineCollector(model_name)
        self.registry.register(self._engine)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        family = Histogram(f"{PREFIX}{name}", doc, ["model_name"], buckets=buckets, registry=self.registry)
        return family.labels(self.model_name)

    def request_finished(self, finish_reason: str) -> None:
        self._request_success.labels(self.model_name, finish_reason).inc()

    def render(self, info: ServerInfo | None) -> bytes:
        """The exposition text; engine metrics from `info` (none when the engine did not answer)."""
        self._engine.info = info
        return generate_latest(self.registry)


class RequestTiming:
    """One request's timing, from the moment the API received it."""

    def __init__(self, metrics: ApiMetrics, start_s: float) -> None:
        self._metrics = metrics
        self._start_s = start_s
        self._last_token_s: float | None = None

    def on_tokens(self, num_tokens: int, now_s: float) -> None:
        if num_tokens <= 0:
            return
        if self._last_token_s is None:
            self._metrics.time_to_first_token.observe(now_s - self._start_s)
            num_tokens -= 1
        else:
            # Several tokens in one output (a non-streamed request, or a catch-up): spread the gap.
            gap = (now_s - self._last_token_s) / num_tokens
            for _ in range(num_tokens):
                self._metrics.inter_token_latency.observe(gap)
        self._last_token_s = now_s

    def on_queued(self, queue_time_s: float) -> None:
        self._metrics.request_queue_time.observe(queue_time_s)

    def on_finish(self, finish_reason: str | None, now_s: float) -> None:
        self._metrics.e2e_request_latency.observe(now_s - self._start_s)
        self._metrics.request_finished(finish_reason or "abort")


class _EngineCollector(Collector):
    """Gauges and counters of the engine, per replica, from the ServerInfo set before a scrape."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.info: ServerInfo | None = None

    def collect(self) -> Iterator[Metric]:
        labels = ["model_name", "replica"]
        gauges = {
            "num_requests_running": ("Requests running, per replica.", lambda s: s.num_running),
            "num_requests_waiting": ("Requests waiting (preempted ones included), per replica.",
                                     lambda s: s.num_waiting),
            "kv_cache_usage_perc": ("Fraction of KV-cache pages used by requests (1 = full).",
                                    lambda s: s.kv_usage),
        }
        counters = {
            "prefix_cache_queries": ("Prompt tokens looked up in the prefix cache.",
                                     lambda s: s.prefix_cache_query_tokens),
            "prefix_cache_hits": ("Prompt tokens found in the prefix cache.",
                                  lambda s: s.prefix_cache_hit_tokens),
            "num_preemptions": ("Requests preempted.", lambda s: s.num_preemptions),
            "prompt_tokens": ("Prompt tokens admitted.", lambda s: s.num_prompt_tokens),
            "generation_tokens": ("Tokens generated.", lambda s: s.num_generation_tokens),
        }
        info = self.info
        replicas = info.replicas if info is not None else []
        up = GaugeMetricFamily(f"{PREFIX}replica_up", "1 while the replica serves, 0 when it is down.",
                               labels=labels)
        for replica in replicas:
            up.add_metric([self.model_name, str(replica.replica)], 1.0 if replica.alive else 0.0)
        yield up
        for name, (doc, value) in gauges.items():
            family = GaugeMetricFamily(f"{PREFIX}{name}", doc, labels=labels)
            for replica in replicas:
                if replica.stats is not None:
                    family.add_metric([self.model_name, str(replica.replica)], float(value(replica.stats)))
            yield family
        for name, (doc, value) in counters.items():
            family = CounterMetricFamily(f"{PREFIX}{name}", doc, labels=labels)
            for replica in replicas:
                if replica.stats is not None:
                    family.add_metric([self.model_name, str(replica.replica)], float(value(replica.stats)))
            yield family
        step_counters = {
            "step_execute_seconds": ("Seconds TP rank 0 spent running steps.", lambda r: r.step_execute_s),
            "step_wait_seconds": ("Seconds TP rank 0 waited for the next plan between back-to-back steps "
                                  "(its GPU idle while the scheduler had work).", lambda r: r.step_wait_s),
        }
        for name, (doc, value) in step_counters.items():
            family = CounterMetricFamily(f"{PREFIX}{name}", doc, labels=labels)
            for replica in replicas:
                family.add_metric([self.model_name, str(replica.replica)], float(value(replica)))
            yield family
