"""How the load generator talks to a server: the OpenAI HTTP API or the native ZeroMQ client.

Each backend sends one request, streaming, and returns its RequestTiming: when it was sent, when
each chunk of tokens arrived, how many prompt and output tokens the server counted, and the
reply's text (a multi-turn conversation sends it back as history). Each also samples the
server's gauges for the report: KV-cache usage and the prefix-cache counters.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from benchmarks.lib.datasets import RequestSpec
from benchmarks.lib.http_endpoints import ENDPOINTS, read_line, request_body

SAMPLING_MODES = ("greedy", "model-defaults")
# A server (or the router gathering its workers' metrics) busy with the run may miss a scrape.
_GAUGE_ATTEMPTS = 3
_GAUGE_RETRY_S = 0.5


@dataclass(frozen=True)
class Sampling:
    """What every request of a run asks for: greedy (temperature 0), or nothing at all so that the
    server applies the checkpoint's generation_config defaults (Qwen3: temperature 0.6, top_p 0.95,
    top_k 20), as users of the OpenAI API do; temperature, top_p and top_k given explicitly are
    sent on top of either."""

    mode: str = "greedy"
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in SAMPLING_MODES:
            raise ValueError(f"sampling mode {self.mode!r} is not one of {', '.join(SAMPLING_MODES)}")

    def fields(self) -> dict[str, float | int]:
        """The request body's sampling fields (the SamplingParams arguments, for the native client)."""
        fields: dict[str, float | int] = {"temperature": 0.0} if self.mode == "greedy" else {}
        for name in ("temperature", "top_p", "top_k"):
            value = getattr(self, name)
            if value is not None:
                fields[name] = value
        return fields

    def describe(self) -> dict[str, object]:
        """For the result JSON: the mode and exactly what each request sent."""
        return {"mode": self.mode, "sent": self.fields()}


@dataclass
class RequestTiming:
    sent_s: float
    chunk_s: list[float] = field(default_factory=list)  # arrival of every chunk that held tokens
    done_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    text: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.done_s is not None and self.output_tokens > 0


@dataclass(frozen=True)
class ServerGauges:
    kv_cache_usage: float  # mean over replicas, 0..1
    prefix_cache_queries: float  # tokens, since start
    prefix_cache_hits: float
    num_running: float
    step_execute_s: float = 0.0  # summed over replicas, since start
    step_wait_s: float = 0.0  # waiting for the next plan between back-to-back steps


class HttpBackend:
    """Streamed POSTs to the OpenAI API (/v1/completions for token ids, /v1/chat/completions for
    multi-turn), or to /v1/responses or /v1/messages (`endpoint`; benchmarks/lib/http_endpoints.py)."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float,
                 sampling: Sampling = Sampling(), text_prompts: bool = False,
                 extra_body: dict | None = None, endpoint: str = "openai") -> None:
        import aiohttp

        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint {endpoint!r} is not one of {', '.join(ENDPOINTS)}")
        self.endpoint = endpoint  # benchmarks/lib/http_endpoints.py

        self.sampling_fields = sampling.fields()
        self.extra_body = extra_body or {}  # merged into every body last (a response_format, say)
        self.text_prompts = text_prompts  # send token-id prompts as text (datasets.ids_as_words)
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            connector=aiohttp.TCPConnector(limit=0),  # the load tool decides concurrency
        )
        self.model: str | None = None

    async def start(self) -> None:
        async with self._session.get(f"{self.base_url}/v1/models", headers=self._headers) as response:
            response.raise_for_status()
            # content_type=None: the SGLang Model Gateway labels its JSON text/plain.
            self.model = (await response.json(content_type=None))["data"][0]["id"]

    async def close(self) -> None:
        await self._session.close()

    async def flush_cache(self) -> str | None:
        """POST /flush_cache (SGLang's route, which Cadence serves too); None once flushed, else why not."""
        async with self._session.post(f"{self.base_url}/flush_cache", headers=self._headers) as response:
            if response.status == 200:
                return None
            return f"HTTP {response.status}: {(await response.text())[:300]}"

    async def send(self, spec: RequestSpec, history: list[dict] | None = None) -> RequestTiming:
        common = {"model": self.model, **self.sampling_fields}
        path, body = request_body(self.endpoint, spec, history, common, self.extra_body, self.text_prompts)
        url = f"{self.base_url}{path}"
        timing = RequestTiming(time.perf_counter())
        try:
            async with self._session.post(url, json=body, headers=self._headers) as response:
                if response.status != 200:
                    timing.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                    return timing
                async for line in response.content:
                    read_line(self.endpoint, timing, line, time.perf_counter())
        except Exception as exc:  # noqa: BLE001 - a failed request is counted, not fatal
            timing.error = f"{type(exc).__name__}: {exc}"
        return timing

    async def gauges(self) -> ServerGauges | None:
        """The server's counters; behind the SGLang Model Gateway, every worker's summed (its
        /engine_metrics gathers them, renaming `cadence:x` to `cadence_x`)."""
        for attempt in range(_GAUGE_ATTEMPTS):  # one missed scrape would cost the run its hit rate
            values = await self._metric_samples("/metrics")
            if values is None or not any(name.startswith("cadence:") for name in values):
                values = await self._metric_samples("/engine_metrics")
            if values is not None:
                break
            await asyncio.sleep(_GAUGE_RETRY_S * (attempt + 1))
        else:
            return None
        values = {name.replace("cadence_", "cadence:", 1): v for name, v in values.items()}

        def total(name: str) -> float:
            return sum(values.get(f"cadence:{name}_total", values.get(f"cadence:{name}", [0.0])))

        usage = values.get("cadence:kv_cache_usage_perc", [0.0])
        return ServerGauges(
            sum(usage) / len(usage),
            total("prefix_cache_queries"),
            total("prefix_cache_hits"),
            total("num_requests_running"),
            total("step_execute_seconds"),
            total("step_wait_seconds"),
        )

    async def _metric_samples(self, path: str) -> dict[str, list[float]] | None:
        from prometheus_client.parser import text_string_to_metric_families

        try:
            async with self._session.get(f"{self.base_url}{path}", headers=self._headers) as response:
                if response.status != 200:
                    return None
                text = await response.text()
        except Exception:  # noqa: BLE001 - a missed sample is not a failed run
            return None
        values: dict[str, list[float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values.setdefault(sample.name, []).append(sample.value)
        return values


class ZmqBackend:
    """The native client (api.client.AsyncClient) on the tokenizer's address; no HTTP."""

    def __init__(self, address: str, timeout_s: float, sampling: Sampling = Sampling()) -> None:
        from api.async_client import AsyncClient

        if sampling.mode == "model-defaults":
            # The checkpoint's defaults are applied by the OpenAI API; a native request says all.
            raise ValueError("--sampling model-defaults needs the http backend: native requests carry "
                             "their sampling parameters whole (give --temperature, --top-p, --top-k)")
        self.sampling_fields = sampling.fields()
        self._client = AsyncClient(address, timeout_s=timeout_s, name="load generator")
        self._ids = 0

    async def start(self) -> None:
        await self._client.start()

    async def flush_cache(self) -> str | None:
        """The native FlushCache; None once flushed, else why not."""
        answer = await self._client.flush_cache()
        return None if answer.flushed else answer.error

    async def close(self) -> None:
        await self._client.close()

    async def send(self, spec: RequestSpec, history: list[dict] | None = None) -> RequestTiming:
        from core.sampling_params import SamplingParams
        from ipc.messages import ChatTurn, GenerateRequest, OutputDelta

        self._ids += 1
        params = SamplingParams(max_tokens=spec.output_len, ignore_eos=True, **self.sampling_fields)
        if spec.prompt_token_ids is not None:
            request = GenerateRequest(
                f"load-{self._ids}", params, prompt_token_ids=spec.prompt_token_ids, detokenize=False
            )
        else:
            turns = [ChatTurn(m["role"], m["content"]) for m in history]
            request = GenerateRequest(f"load-{self._ids}", params, messages=turns)
        timing = RequestTiming(time.perf_counter())
        try:
            async with await self._client.open([request]) as group:
                async for out in group:
                    if not isinstance(out, OutputDelta):
                        timing.error = out.message
                        break
                    if out.token_ids:
                        timing.chunk_s.append(time.perf_counter())
                    timing.text += out.text
                    timing.prompt_tokens, timing.output_tokens = out.num_prompt_tokens, out.num_output_tokens
                    timing.cached_tokens = out.num_cached_tokens
                    if out.finished:
                        timing.done_s = time.perf_counter()
                        timing.error = out.error
        except Exception as exc:  # noqa: BLE001 - a failed request is counted, not fatal
            timing.error = f"{type(exc).__name__}: {exc}"
        return timing

    async def gauges(self) -> ServerGauges | None:
        for attempt in range(_GAUGE_ATTEMPTS):  # as the HTTP backend: a missed answer is asked again
            try:
                info = await self._client.server_info()
                break
            except Exception:  # noqa: BLE001 - a missed sample is not a failed run
                await asyncio.sleep(_GAUGE_RETRY_S * (attempt + 1))
        else:
            return None
        stats = [r.stats for r in info.replicas if r.stats is not None]
        if not stats:
            return None
        return ServerGauges(
            sum(s.kv_usage for s in stats) / len(stats),
            sum(s.prefix_cache_query_tokens for s in stats),
            sum(s.prefix_cache_hit_tokens for s in stats),
            sum(s.num_running for s in stats),
            sum(r.step_execute_s for r in info.replicas),
            sum(r.step_wait_s for r in info.replicas),
        )
