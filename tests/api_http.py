"""Helpers for the api tests: a real uvicorn on loopback in a thread, and a small HTTP client.

The client is the standard library's http.client (no extra test dependency); `sse_events` reads an
event stream the way OpenAI's SDK does: `data: <json>` events until `data: [DONE]`.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from typing import Any

import orjson
import uvicorn


class UvicornThread:
    """Serves an ASGI app on 127.0.0.1 (a free port) until the `with` block ends."""

    def __init__(self, app: Any) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._socket]},
                                        name="uvicorn", daemon=True)

    def __enter__(self) -> UvicornThread:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("uvicorn did not start within 10 s")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(10)
        self._socket.close()


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return orjson.loads(self.body)

    def __repr__(self) -> str:
        return f"Reply({self.status}, {self.body[:300]!r})"


def request(port: int, method: str, path: str, body: Any = None, *, raw: Any = None,
            headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        data = raw if raw is not None else (orjson.dumps(body) if body is not None else None)
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        chunked = data is not None and not isinstance(data, bytes)  # an iterable of chunks
        conn.request(method, path, body=data, headers=all_headers, encode_chunked=chunked)
        response = conn.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        conn.close()


def post(port: int, path: str, body: Any = None, **kwargs: Any) -> Reply:
    return request(port, "POST", path, body, **kwargs)


def get(port: int, path: str, **kwargs: Any) -> Reply:
    return request(port, "GET", path, **kwargs)


def sse_events(reply: Reply) -> list[Any]:
    """The events of an SSE body, decoded, ending with the string "[DONE]"."""
    events = []
    for block in reply.body.decode().split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), f"not an SSE data event: {block[:80]!r}"
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return events
