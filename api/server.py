"""The OpenAI-compatible REST server: a Starlette app, served by uvicorn (api/cli.py).

Routes:
* POST /v1/completions, POST /v1/chat/completions: stream true (SSE) or false; see
  api/openai_serving.py for how one call runs, api/protocol.py for what a body may hold.
* POST /v1/responses: OpenAI's Responses API, served as a chat completion (api/responses_request.py,
  api/responses_call.py); nothing is stored, so each request carries its whole conversation.
* POST /v1/messages: Anthropic's Messages API, the same way (api/anthropic_request.py,
  api/anthropic_call.py), its errors in Anthropic's form; the key may come as `x-api-key`.
  POST /v1/messages/count_tokens: a Messages body's prompt tokens (api/anthropic_count.py).
* GET /v1/models: the one served model; GET /v1/models/{id}: it again, or 404.
* GET /get_model_info, /model_info, /get_server_info, /server_info: the SGLang runtime's names for
  what the model is, which the SGLang Model Gateway (`sglang_router`) asks every worker it
  registers; without them it lists the model as "unknown" (docs/deploy.md).
* POST /tokenize, POST /detokenize, GET /tokenizer_info: the model's tokenizer, in vLLM's fields
  (api/tokenizer_routes.py).
* GET/POST /flush_cache (SGLang's), POST /reset_prefix_cache (vLLM's): empty the prefix caches while
  no request runs or waits (api/cache_routes.py).
* GET /health: 200 while the engine serves (ServerInfo.serving), 503 when it does not or when the
  tokenizer does not answer; the body says why.
* GET /metrics: Prometheus text (api/metrics.py). GET /version.

The app is one client of the tokenizer process: one AsyncClient (one DEALER socket), started in
the app's lifespan. An HTTP client that disconnects, while its response streams or while it waits
for a whole one, aborts its requests (AbortRequest) at once. With an API key (ApiConfig.api_key,
or the CADENCE_API_KEY environment variable through the CLI) every /v1/ route and the cache flush
need `Authorization: Bearer <key>`; /health, /metrics and /version stay open for probes and scrapers.
Bodies over `max_body_bytes` get 413 before they are read whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from api.anthropic_call import MessagesCall, anthropic_error
from api.anthropic_count import parse_count_tokens_body
from api.anthropic_request import parse_messages_body
from api.async_client import AsyncClient
from api.cache_routes import FLUSH_PATHS, cache_routes
from api.client_errors import ClientError
from api.errors import AUTHENTICATION, NOT_FOUND, SERVER_ERROR, ApiError, error_object, invalid
from api.json_response import JSONResponse
from api.metrics import CONTENT_TYPE, ApiMetrics
from api.openai_serving import make_call
from api.protocol import (
    ParsedRequest,
    ServedModel,
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
)
from api.request_id import RequestIdEcho
from api.responses_call import ResponsesCall
from api.responses_request import parse_responses_body
from api.tokenizer_routes import tokenizer_routes
from ipc.messages import ReplicaInfo

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
_T = TypeVar("_T")


@dataclass(frozen=True)
class ApiConfig:
    model: ServedModel
    tokenizer_address: str  # the tokenizer's ROUTER (Launcher.endpoints.tokenizer_frontend)
    api_key: str | None = None  # None: /v1/ routes are open
    tokenizer_api_key: str | None = None  # presented to the tokenizer's front end when it requires one
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    timeout_s: float = 600.0  # the longest a request may go without an output before a 504
    info_timeout_s: float = 5.0  # /health and /metrics wait this long for the engine's state
    strict_request_fields: bool = False  # refuse (400) body fields this server does not know

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (use None for no key)")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, got {self.max_body_bytes}")
        if self.timeout_s <= 0 or self.info_timeout_s <= 0:
            raise ValueError("timeout_s and info_timeout_s must be positive")


class SSEResponse(StreamingResponse):
    """An event stream whose `on_close` runs however the stream ends: finished, failed, or the
    client gone (Starlette cancels the sending task, or sending raises, depending on the server)."""

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with contextlib.suppress(Exception):
                await self._events.aclose()  # type: ignore[attr-defined]
            self._on_close()


class _ApiKeyCheck:
    """ASGI middleware: /v1/ routes and the cache flush need `Authorization: Bearer <key>`."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()
        self._expected_key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["path"].startswith("/v1/") or scope["path"] in FLUSH_PATHS):
            headers = dict(scope["headers"])
            given = headers.get(b"authorization", b"")
            key = headers.get(b"x-api-key", b"")  # how Anthropic's clients send it
            if not (hmac.compare_digest(given, self._expected)
                    or hmac.compare_digest(key, self._expected_key)):
                if given or key:
                    message = f"invalid API key in the {'Authorization' if given else 'x-api-key'} header"
                else:
                    message = "missing Authorization header; send 'Authorization: Bearer <api key>'"
                response = JSONResponse(error_object(message, AUTHENTICATION), status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _ClientGone(Exception):
    """The HTTP client disconnected before its response was ready."""


class ApiServer:
    """The routes' state: the served model, the tokenizer client, the metrics."""

    def __init__(self, config: ApiConfig) -> None:
        self.config = config
        self.metrics = ApiMetrics(config.model.name)
        self.client = AsyncClient(config.tokenizer_address, timeout_s=config.timeout_s, name="api server",
                                  api_key=config.tokenizer_api_key)
        self.created = int(time.time())
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._loop = asyncio.get_running_loop()
        await self.client.start()
        try:
            yield
        finally:
            await self.client.close()

    def engine_stopped(self, reason: str) -> None:
        """The engine is gone (the launcher saw the scheduler or tokenizer die); callable from any
        thread. Every waiting request ends with a 503 (an error event when it streams) naming what
        died, and /health answers 503, instead of each waiting out the request timeout."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.client.fail, f"the engine stopped: {reason}")

    # --- generation ----------------------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, lambda body, start_s: self._call(body, parse_completion_request,
                                                                           "cmpl", start_s))

    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(request, lambda body, start_s: self._call(body, parse_chat_request,
                                                                           "chatcmpl", start_s))

    async def responses(self, request: Request) -> Response:
        """OpenAI's Responses API, served as the chat completion it asks for (api/responses_request.py)."""
        def build(body: Any, start_s: float) -> ResponsesCall:
            asked = parse_responses_body(body)
            return ResponsesCall(asked, self._call(asked.chat_body, parse_chat_request, "chatcmpl", start_s))
        return await self._serve(request, build)

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API, served as the chat completion it asks for
        (api/anthropic_request.py); its errors in Anthropic's form."""
        def build(body: Any, start_s: float) -> MessagesCall:
            asked = parse_messages_body(body)
            return MessagesCall(asked, self._call(asked.chat_body, parse_chat_request, "chatcmpl", start_s))
        try:
            return await self._serve(request, build)
        except ApiError as e:
            return anthropic_error(e)

    async def count_message_tokens(self, request: Request) -> Response:
        """Anthropic's token count of a Messages body (api/anthropic_count.py)."""
        try:
            body = parse_json_body(await self.read_body(request))
            query = parse_count_tokens_body(body, self.config.model, uuid.uuid4().hex)
            try:
                answer = await self.client.ask_tokenizer(query, self.config.info_timeout_s)
            except ClientError as e:
                raise ApiError(503, f"the tokenizer did not answer: {e}") from None
            if answer.error is not None:
                raise invalid(answer.error_field, answer.error)
            return JSONResponse({"input_tokens": answer.body["count"]})
        except ApiError as e:
            return anthropic_error(e)

    def _call(self, body: Any, parse: Callable[..., ParsedRequest], id_prefix: str, start_s: float) -> Any:
        call_id = f"{id_prefix}-{uuid.uuid4().hex}"
        parsed = parse(body, self.config.model, call_id, strict_fields=self.config.strict_request_fields)
        return make_call(parsed, self.client, self.metrics, call_id, start_s)

    async def _serve(self, request: Request, build: Callable[[Any, float], Any]) -> Response:
        """Run one generation call (`build` makes it from the body): SSE or a whole JSON response."""
        start_s = time.monotonic()
        try:
            body = parse_json_body(await self.read_body(request))
        except ClientDisconnect:
            return Response(status_code=499)  # gone before its body arrived; nothing was sent yet
        call = build(body, start_s)
        streaming = False
        try:
            await _unless_disconnected(request, call.start())
            if call.stream:
                streaming = True  # from here the response owns the call and closes it
                return SSEResponse(call.events(), on_close=call.close)
            return JSONResponse(await _unless_disconnected(request, call.collect()))
        except _ClientGone:
            return Response(status_code=499)  # nobody reads it; the requests are aborted below
        finally:
            if not streaming:
                call.close()

    async def read_body(self, request: Request) -> bytes:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise invalid(None, f"Content-Length {declared!r} is not a number")
            if int(declared) > limit:
                raise ApiError(413, f"the request body is {declared} bytes; the limit is {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"the request body is over the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    # --- state ---------------------------------------------------------------------------------------

    def _model_card(self) -> dict[str, Any]:
        model = self.config.model
        return {"id": model.name, "object": "model", "created": self.created, "owned_by": "cadence",
                "root": model.name, "parent": None, "max_model_len": model.max_model_len}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["model_id"]
        if name != self.config.model.name:
            raise ApiError(404, f"the model {name!r} does not exist; this server serves "
                           f"{self.config.model.name!r}", "model", NOT_FOUND)
        return JSONResponse(self._model_card())

    async def model_info(self, request: Request) -> Response:
        """The SGLang runtime's model and server info, in its field names (a router's view of us). The
        SGLang Model Gateway names the model by served_model_name; given a model_path it would also
        try to fetch a tokenizer from there (the Hugging Face hub), which it does not need to route."""
        model = self.config.model
        return JSONResponse({"model_path": None, "tokenizer_path": None,
                             "served_model_name": model.name, "is_generation": True,
                             "context_length": model.max_model_len, "max_model_len": model.max_model_len})

    async def load(self, request: Request) -> Response:
        """Each replica's load as the SGLang runtime reports it (GET /get_load), for routers that
        balance by it (the SGLang Model Gateway's power-of-two policy): requests running and waiting,
        and num_tokens, the prompt and output tokens routed to the replica and not yet finished."""
        try:
            info = await self.client.server_info(self.config.info_timeout_s)
        except ClientError as e:
            return JSONResponse(error_object(f"the engine's load is unknown: {e}", SERVER_ERROR), 503)
        return JSONResponse([_replica_load(r) for r in info.replicas])

    async def health(self, request: Request) -> Response:
        try:
            info = await self.client.server_info(self.config.info_timeout_s)
        except ClientError as e:
            return JSONResponse({"status": "unavailable", "reason": str(e)}, status_code=503)
        replicas = [{"replica": r.replica, "alive": r.alive, "reason": r.reason} for r in info.replicas]
        body = {"status": "ok" if info.serving else "unavailable", "replicas": replicas,
                "status_age_s": info.status_age_s}
        if not info.serving:
            down = "; ".join(f"replica {r.replica}: {r.reason}" for r in info.replicas if not r.alive)
            body["reason"] = "the engine is not serving" + (f" ({down})" if down else "")
        return JSONResponse(body, status_code=200 if info.serving else 503)

    async def metrics_text(self, request: Request) -> Response:
        try:
            info = await self.client.server_info(self.config.info_timeout_s)
        except ClientError:
            info = None  # the api's own metrics are still worth scraping
        return Response(self.metrics.render(info), media_type=CONTENT_TYPE)

    async def version(self, request: Request) -> Response:
        try:
            version = metadata.version("cadence")
        except metadata.PackageNotFoundError:
            version = "unknown"
        return JSONResponse({"version": version})


def _replica_load(replica: ReplicaInfo) -> dict:
    stats = replica.stats
    running, waiting = (stats.num_running, stats.num_waiting) if stats is not None else (0, 0)
    return {"dp_rank": replica.replica, "num_reqs": running + waiting, "num_waiting_reqs": waiting,
            "num_tokens": replica.routed_load_tokens, "alive": replica.alive}


async def _unless_disconnected(request: Request, work: Awaitable[_T]) -> _T:
    """`work`'s result, or _ClientGone as soon as the HTTP client disconnects."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise _ClientGone()
    finally:
        watcher.cancel()
        task.cancel()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.to_dict(), status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message, kind = f"no route {request.method} {request.url.path}", NOT_FOUND
    else:
        message, kind = f"{request.method} {request.url.path}: {exc.detail}", "invalid_request_error"
    return JSONResponse(error_object(message, kind), status_code=exc.status_code, headers=exc.headers)


async def _unexpected(request: Request, exc: Exception) -> Response:
    return JSONResponse(error_object(f"internal error: {type(exc).__name__}: {exc}", SERVER_ERROR), 500)


def build_app(config: ApiConfig) -> Starlette:
    server = ApiServer(config)
    routes = [
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/v1/responses", server.responses, methods=["POST"]),
        Route("/v1/messages", server.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", server.count_message_tokens, methods=["POST"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", server.model, methods=["GET"]),
        *(Route(path, server.model_info, methods=["GET"])
          for path in ("/get_model_info", "/model_info", "/get_server_info", "/server_info")),
        *tokenizer_routes(server),
        *cache_routes(server),
        Route("/get_load", server.load, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.metrics_text, methods=["GET"]),
        Route("/version", server.version, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=server.lifespan,
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected},
    )
    app.state.server = server
    if config.api_key is not None:
        app.add_middleware(_ApiKeyCheck, api_key=config.api_key)
    app.add_middleware(RequestIdEcho)  # outermost: a refused key's 401 carries the id too
    return app
