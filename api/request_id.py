"""X-Request-Id: a request's id from the client or gateway in front, echoed on its response.

Gateways and tracing proxies (the SGLang Model Gateway, Envoy, nginx) put an `X-Request-Id` on
each request they forward and match the response, and the logs, by it; vLLM echoes it. Every
response carries the request's own header back, errors and event streams included (the middleware
adds it where the response starts). A value that is not a short printable string is not echoed.
The completion's `id` stays Cadence's own, unique among the requests in flight.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
MAX_LENGTH = 256


def request_id_of(scope: Scope) -> bytes | None:
    """The request's X-Request-Id if it is one to echo: 1 to 256 printable ASCII characters."""
    value = dict(scope.get("headers") or ()).get(HEADER)
    if not value or len(value) > MAX_LENGTH or not all(0x20 < c < 0x7F for c in value):
        return None
    return value


class RequestIdEcho:
    """ASGI middleware: the request's X-Request-Id on its response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        value = request_id_of(scope) if scope["type"] == "http" else None
        if value is None:
            await self.app(scope, receive, send)
            return

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", ()) if h[0].lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, value)]}
            await send(message)

        await self.app(scope, receive, send_with_id)
