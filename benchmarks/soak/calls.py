"""One soak call: send a Shot and judge the answer as ok, disconnected (by design), refused (a bad
request answered 4xx with an error object), failed (anything else that is wrong) or lost (no answer
within the call's timeout). The OpenAI API's replies are judged here, those of the Responses and
Messages APIs by benchmarks/soak/agent_replies.py."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import orjson

from benchmarks.soak import agent_replies
from benchmarks.soak.verdict import Verdict
from benchmarks.soak.workload import CHAT, MESSAGES, RESPONSES, Shot


@dataclass
class Outcome:
    category: str  # "ok", "disconnected", "refused", "failed" or "lost"
    detail: str = ""  # why it failed; the status of a refusal
    latency_s: float = 0.0
    completion_tokens: int = 0


async def fire(session: Any, base_url: str, shot: Shot, timeout_s: float) -> Outcome:
    """Send one shot and judge what came back."""
    start = time.perf_counter()
    answered = False
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(base_url + shot.path, data=shot.body,
                                    headers={"Content-Type": "application/json"}) as response:
                answered = True
                outcome = await _judge(response, shot)
    except Verdict as e:
        outcome = Outcome("failed", str(e))
    except TimeoutError:
        outcome = Outcome("failed" if answered else "lost", f"no {'end' if answered else 'answer'} within "
                          f"{timeout_s:.0f} s")
    except Exception as e:  # noqa: BLE001 - a broken call is counted, not fatal
        outcome = Outcome("failed", f"{type(e).__name__}: {e}")
    outcome.latency_s = time.perf_counter() - start
    if outcome.category == "failed":
        outcome.detail = f"#{shot.index} {shot.label}: {outcome.detail}"
    return outcome


async def _judge(response: Any, shot: Shot) -> Outcome:
    if shot.kind == "bad":
        return await _judge_refusal(response, shot)
    if response.status != 200:
        raise Verdict(f"HTTP {response.status}: {(await response.text())[:300]}")
    if shot.kind == "disconnect":
        return await _drop(response, shot)
    if shot.path in (RESPONSES, MESSAGES):
        tokens = await agent_replies.judge(response, shot)
        _check_tokens(tokens, shot)
        return Outcome("ok", completion_tokens=tokens)
    if shot.stream:
        return await _judge_stream(response, shot)
    return _judge_whole(await response.json(loads=orjson.loads), shot)


async def _judge_refusal(response: Any, shot: Shot) -> Outcome:
    text = await response.text()
    if not 400 <= response.status < 500:
        raise Verdict(f"a bad request was answered HTTP {response.status}: {text[:300]}")
    try:
        error = orjson.loads(text)["error"]
        ok = isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        ok = False
    if not ok:
        raise Verdict(f"HTTP {response.status} without an OpenAI error object: {text[:300]}")
    return Outcome("refused", str(response.status))


async def _drop(response: Any, shot: Shot) -> Outcome:
    """Read a chunk or two, then close the connection under the server."""
    seen = 0
    async for line in response.content:
        if line.startswith(b"data:"):
            seen += 1
            if seen >= shot.chunks_before_drop:
                break
    response.close()
    return Outcome("disconnected")


async def _judge_stream(response: Any, shot: Shot) -> Outcome:
    finishes: dict[int, str] = {}
    done = False
    tokens = 0
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if done:
            raise Verdict(f"data after [DONE]: {payload[:200]!r}")
        if payload == b"[DONE]":
            done = True
            continue
        chunk = orjson.loads(payload)
        if "error" in chunk:
            raise Verdict(f"error event: {chunk['error']}")
        for choice in chunk["choices"]:
            if choice.get("finish_reason") is not None:
                finishes[choice["index"]] = choice["finish_reason"]
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    if not done:
        raise Verdict("the stream ended without [DONE]")
    _check_finishes(finishes, shot)
    if shot.usage:
        _check_tokens(tokens, shot)
    return Outcome("ok", completion_tokens=tokens)


def _judge_whole(body: dict[str, Any], shot: Shot) -> Outcome:
    expected = "chat.completion" if shot.path == CHAT else "text_completion"
    if body.get("object") != expected:
        raise Verdict(f"object {body.get('object')!r}, expected {expected!r}")
    if len(body["choices"]) != shot.n:
        raise Verdict(f"{len(body['choices'])} choices, expected {shot.n}")
    _check_finishes({c["index"]: c["finish_reason"] for c in body["choices"]}, shot)
    tokens = body["usage"]["completion_tokens"]
    _check_tokens(tokens, shot)
    return Outcome("ok", completion_tokens=tokens)


def _check_finishes(finishes: dict[int, str | None], shot: Shot) -> None:
    if sorted(finishes) != list(range(shot.n)):
        raise Verdict(f"finish_reason for choices {sorted(finishes)}, expected {list(range(shot.n))}")
    odd = {i: r for i, r in finishes.items() if r not in ("stop", "length")}
    if odd:
        raise Verdict(f"finish_reason {odd}, expected 'stop' or 'length'")


def _check_tokens(tokens: int, shot: Shot) -> None:
    if not shot.n <= tokens <= shot.n * shot.max_tokens:
        raise Verdict(f"usage.completion_tokens {tokens}, expected {shot.n}..{shot.n * shot.max_tokens}")
