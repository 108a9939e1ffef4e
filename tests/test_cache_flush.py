"""Flushing the prefix cache on the real system: a DP=2 server on the CPU (qwen3-tiny, dummy weights),
its REST server with an API key, and native clients on the tokenizer's ipc address.

What a flush must do: empty both replicas' caches (the same prompts then miss, and the pools are all
free), refuse while a request runs and leave that request alone, answer on every route SGLang and
vLLM clients call, need the key, and answer a malformed query instead of leaving its client waiting.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import orjson
import pytest
import zmq
from api_http import UvicornThread, get, post

from api.client import AsyncClient, Client
from api.protocol import ServedModel
from api.server import ApiConfig, build_app
from core.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from core.sampling_params import SamplingParams
from procs.launcher import Launcher, LaunchOptions
from procs.tokenizer_proc import STATUS_STALE_S

KEY = "flush key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BLOCK = 16
GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def system():
    config = EngineConfig(model=ModelConfig.from_name("qwen3-tiny"), parallel=ParallelConfig(dp_size=2),
                          cache=CacheConfig(num_pages=128, block_size=BLOCK),
                          scheduler=SchedulerConfig(max_model_len=512, max_num_seqs=16,
                                                    max_num_batched_tokens=256), device="cpu")
    options = LaunchOptions(served_model_name="tiny", startup_timeout_s=180)
    with Launcher(config, options) as launcher:
        address = launcher.endpoints.tokenizer_frontend
        api = ApiConfig(ServedModel("tiny", config.max_model_len, config.model.generation), address,
                        api_key=KEY, timeout_s=60)
        with UvicornThread(build_app(api)) as server, Client(address, timeout_s=60) as client:
            yield server.port, address, client, launcher


def prompts(seed: int, count: int = 6, length: int = 3 * BLOCK + 5) -> list[list[int]]:
    """Distinct prompts, each with three whole pages to cache (all but the last token's page)."""
    return [[1000 + seed * 997 + i * 131 + j for j in range(length)] for i in range(count)]


def cached_pages(client: Client) -> list[int]:
    """Each replica's cached-only pages, once two of the scheduler's reports (every 0.2 s) agree."""
    last = None
    for _ in range(50):
        pages = [r.stats.num_cached_pages for r in client.server_info(10).replicas]
        if pages == last:
            return pages
        last = pages
        time.sleep(0.3)
    raise AssertionError(f"the cached pages kept changing: last {last}")


def test_a_flush_empties_both_replicas_and_the_same_prompts_miss_again(system):
    port, _, client, _ = system
    batch = prompts(1)
    cold = client.generate(batch, GREEDY)
    hot = client.generate(batch, GREEDY)
    assert all(g.ok and g.num_cached_tokens == 0 for g in cold), cold
    assert [g.num_cached_tokens for g in hot] == [3 * BLOCK] * len(batch)
    before = cached_pages(client)
    assert all(before), f"both replicas should hold cached pages, got {before}"

    reply = post(port, "/flush_cache", headers=AUTH)
    assert reply.status == 200, reply
    assert reply.json() == {"flushed": True, "freed_pages": sum(before)}
    assert cached_pages(client) == [0, 0]

    again = client.generate(batch, GREEDY)
    assert [g.num_cached_tokens for g in again] == [0] * len(batch)
    assert [g.token_ids for g in again] == [g.token_ids for g in cold]


def test_a_flush_while_a_request_runs_is_refused_and_the_request_finishes(system):
    port, _, client, _ = system
    long = SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True)
    stream = client.stream(prompts(2, count=1)[0], long)
    outputs = [next(stream)]  # it runs: its first token is out
    reply = post(port, "/flush_cache", headers=AUTH)
    assert reply.status == 400, reply
    message = reply.json()["error"]["message"]
    assert "not flushed" in message and "has 1 running and 0 waiting request(s)" in message, message
    outputs.extend(stream)
    assert outputs[-1].finish_reason == "length"
    assert sum(len(o.token_ids) for o in outputs) == 120
    assert post(port, "/flush_cache", headers=AUTH).status == 200  # idle again: it flushes


def test_every_flush_route_needs_the_key_and_flushes(system):
    port, _, client, _ = system
    for method, path in (("POST", "/flush_cache"), ("GET", "/flush_cache"), ("POST", "/reset_prefix_cache")):
        call = post if method == "POST" else get
        refused = call(port, path)
        assert refused.status == 401, (method, path, refused)
        assert "Authorization" in refused.json()["error"]["message"]
        client.generate(prompts(3, count=2), GREEDY)
        reply = call(port, path, headers=AUTH)
        assert reply.status == 200 and reply.json()["flushed"], (method, path, reply)
        assert reply.json()["freed_pages"] >= 2 * 3, (method, path, reply)
    assert get(port, "/reset_prefix_cache", headers=AUTH).status == 405


def test_native_clients_flush_and_hear_why_not(system):
    _, address, client, _ = system
    client.generate(prompts(4, count=2), GREEDY)
    answer = client.flush_cache()
    assert answer.flushed and answer.freed_pages >= 2 * 3 and answer.error is None

    async def flush_while_one_runs():
        async with AsyncClient(address, timeout_s=60) as native:
            params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
            stream = native.stream(prompts(5, count=1)[0], params)
            await anext(stream)
            refused = await native.flush_cache()
            rest = [o async for o in stream]
            return refused, rest[-1].finish_reason, await native.flush_cache()

    refused, finish_reason, flushed = asyncio.run(flush_while_one_runs())
    assert not refused.flushed and "1 running" in refused.error
    assert finish_reason == "length" and flushed.flushed


@pytest.mark.parametrize("body, answer_type", [
    (b'{"type": "FlushCache", "body": {"query_id": "q-flush", "replica": "all"}}', "CacheFlushed"),
    (b'{"type": "TokenizerQuery", "body": {"query_id": "q-tokenize", "kind": "nope"}}', "TokenizerAnswer"),
])
def test_a_malformed_query_is_answered_with_what_is_wrong(system, body, answer_type):
    _, address, _, _ = system
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.connect(address)
    try:
        socket.send(body)
        assert socket.poll(10_000), f"no answer to {body!r} within 10 s"
        answer = orjson.loads(socket.recv())
    finally:
        socket.close(linger=0)
    assert answer["type"] == answer_type
    assert answer["body"]["query_id"] == orjson.loads(body)["body"]["query_id"]
    assert "invalid message" in answer["body"]["error"]


def test_a_flush_while_the_scheduler_is_stuck_is_answered_at_once_naming_it(system):
    """Last in this module: its scheduler is stopped (SIGSTOP) and then continued."""
    port, _, client, launcher = system
    scheduler = launcher.scheduler.process.pid
    os.kill(scheduler, signal.SIGSTOP)
    try:
        # Asked while its last report is fresh: forwarded, then given up once the reports stop.
        asked_s = time.monotonic()
        answer = client.flush_cache(timeout_s=STATUS_STALE_S + 5)
        assert STATUS_STALE_S - 1 < time.monotonic() - asked_s < STATUS_STALE_S + 2
        assert not answer.flushed and answer.status == 503
        assert "since the flush was asked for" in answer.error and "unknown" in answer.error
        time.sleep(0.5)  # its last report is now stale
        asked_s = time.monotonic()
        answer = client.flush_cache(timeout_s=10)
        assert time.monotonic() - asked_s < 2
        assert not answer.flushed and answer.status == 503
        assert "the scheduler has not reported for" in answer.error
        reply = post(port, "/flush_cache", headers=AUTH)
        assert reply.status == 503 and "has not reported" in reply.json()["error"]["message"], reply
    finally:
        os.kill(scheduler, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while not client.server_info(10).serving:  # its reports resume
        assert time.monotonic() < deadline, "the scheduler did not report again after SIGCONT"
        time.sleep(0.1)
    assert client.flush_cache(timeout_s=10).flushed
