"""`cadence run-batch -i requests.jsonl -o results.jsonl --model ...`: a file of requests in OpenAI's
Batch API format, run offline through the same API code a server runs (vLLM's `run-batch`).

Each input line is `{"custom_id": "...", "method": "POST", "url": "/v1/chat/completions",
"body": {...}}`; the URL one of /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages.
Each output line, in the input's order, is
`{"id": "batch_req_...", "custom_id": "...", "response": {"status_code": 200, "request_id": "...",
"body": {...}}, "error": null}`; a request the API refused keeps its status and error body there,
and `error` says it again as `{"code", "message"}`. A line that is not such a request (bad JSON, a
custom_id seen before, another method or URL, `stream: true`) gets an output line with its error and
status 400; the others still run. Every request is sent at once, at most --max-concurrency in flight,
so the engine batches them as it would a server's load.

The requests go through the app of api/server.py called in-process (ASGI, no socket): the same
validation, defaults, templates and rendering as `cadence serve`, without a port to open.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from api.server import ApiConfig, build_app

log = logging.getLogger("cadence.api")

URLS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")


@dataclass(frozen=True)
class BatchLine:
    """One input line: its request, or why it is not one (`problem`)."""

    number: int  # 1-based, for messages
    custom_id: str | None
    url: str = ""
    body: bytes = b""
    problem: str | None = None


def read_lines(lines: list[bytes]) -> list[BatchLine]:
    """Every non-blank line as a BatchLine; the checks OpenAI's Batch API makes of a file."""
    seen: set[str] = set()
    batch = []
    for number, raw in enumerate(lines, 1):
        if raw.strip():
            batch.append(_read_line(number, raw, seen))
    return batch


def _read_line(number: int, raw: bytes, seen: set[str]) -> BatchLine:
    try:
        line = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return BatchLine(number, None, problem=f"line {number} is not JSON: {exc}")
    if not isinstance(line, dict):
        return BatchLine(number, None, problem=f"line {number} must be a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return BatchLine(number, None, problem=f"line {number}: 'custom_id' must be a non-empty string")
    if custom_id in seen:
        return BatchLine(number, custom_id, problem=f"line {number}: custom_id {custom_id!r} is used by an "
                         "earlier line; each must be unique")
    seen.add(custom_id)
    if line.get("method", "POST") != "POST":
        return BatchLine(number, custom_id, problem=f"line {number}: 'method' must be POST")
    url = line.get("url")
    if url not in URLS:
        return BatchLine(number, custom_id, problem=f"line {number}: 'url' must be one of {', '.join(URLS)}; "
                         f"got {url!r}")
    body = line.get("body")
    if not isinstance(body, dict):
        return BatchLine(number, custom_id, problem=f"line {number}: 'body' must be a JSON object")
    if body.get("stream"):
        return BatchLine(number, custom_id, problem=f"line {number}: a batch request cannot stream; "
                         "leave 'stream' out")
    return BatchLine(number, custom_id, url, orjson.dumps(body))


async def post(app: Callable[..., Awaitable[None]], path: str, body: bytes) -> tuple[int, bytes]:
    """POST `body` to `path` of an ASGI app in this process: (status, response body)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}
    sent = False
    answered = asyncio.Event()
    status, chunks = 500, []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()  # the client stays connected until the whole response is in
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                answered.set()

    try:
        await app(scope, receive, send)
    except Exception as exc:  # noqa: BLE001 - one request's bug is its line's error, not the batch's end
        log.exception("run-batch: the request to %s raised", path)
        if not answered.is_set():
            message = f"internal error: {type(exc).__name__}: {exc}"
            return 500, orjson.dumps({"error": {"message": message, "type": "server_error"}})
    answered.set()
    return status, b"".join(chunks)


def _result(line: BatchLine, status: int, body: Any) -> dict[str, Any]:
    error = None
    if status != 200:
        detail = body.get("error") if isinstance(body, dict) else None
        detail = detail if isinstance(detail, dict) else {}
        error = {"code": detail.get("type") or str(status), "message": detail.get("message") or str(body)}
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line.custom_id,
            "response": {"status_code": status, "request_id": uuid.uuid4().hex, "body": body}, "error": error}


async def run_lines(app: Any, batch: list[BatchLine], max_concurrency: int,
                    progress_every: int = 100) -> list[dict[str, Any]]:
    """Every line's output object, in order, through `app` (build_app's; its lifespan around them)."""
    slots = asyncio.Semaphore(max_concurrency)
    done = 0
    started = time.monotonic()

    async def one(line: BatchLine) -> dict[str, Any]:
        nonlocal done
        if line.problem is not None:
            result = _result(line, 400, {"error": {"message": line.problem, "type": "invalid_request_error"}})
        else:
            async with slots:
                status, raw = await post(app, line.url, line.body)
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                body = raw.decode(errors="replace")
            result = _result(line, status, body)
        done += 1
        if progress_every and done % progress_every == 0:
            log.info("run-batch: %d of %d requests done in %.1f s", done, len(batch),
                     time.monotonic() - started)
        return result

    async with app.router.lifespan_context(app):
        return list(await asyncio.gather(*(one(line) for line in batch)))


def run_batch(args: argparse.Namespace) -> int:
    """The command: read and check the input, start the engine, run every line, write the output.
    Exit 0 once every line has its output line (refusals included), 1 if the engine stopped."""
    from api.cli import EngineWatch, start_engine

    lines = sys.stdin.buffer.read() if args.input_file == "-" else _read_file(args.input_file)
    batch = read_lines(lines.splitlines())
    out = sys.stdout.buffer if args.output_file == "-" else open(args.output_file, "wb")  # noqa: SIM115
    watch = EngineWatch()
    try:
        with start_engine(args, watch) as (model, tokenizer_address):
            config = ApiConfig(model, tokenizer_address, timeout_s=args.request_timeout,
                               strict_request_fields=args.strict_request_fields)
            watch.app = build_app(config)
            results = asyncio.run(run_lines(watch.app, batch, args.max_concurrency))
        out.write(b"".join(orjson.dumps(result) + b"\n" for result in results))
    finally:
        if out is not sys.stdout.buffer:
            out.close()
    refused = sum(result["error"] is not None for result in results)
    log.info("run-batch: %d requests, %d ok, %d with an error; results in %s", len(results),
             len(results) - refused, refused, args.output_file)
    if watch.reason is not None:
        log.error("run-batch: the engine stopped: %s", watch.reason)
        return 1
    return 0


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
