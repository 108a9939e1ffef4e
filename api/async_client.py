"""AsyncClient: the native client for asyncio, and the REST server's one connection to the tokenizer.

One DEALER socket (zmq.asyncio) to the tokenizer's ROUTER. A background task reads it and hands
every output to the `RequestGroup` of its request (the requests one caller sent together, e.g.
the n choices of an API call), so a caller waits on its own queue only. Batch helpers
(`generate`, `as_completed`, `stream`) sit on top, with the sync Client's semantics
(api/client.py): every wait is bounded by `timeout_s` of silence, and `ClientTimeout` names the
tokenizer's address and the requests that got nothing. With `api_key` it presents the key to a
front end that requires one (ipc/native_auth.py); a refused key fails every call at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import replace

import zmq
import zmq.asyncio

from api.address_check import check_answers
from api.client_errors import (
    DEFAULT_TIMEOUT_S,
    HANDSHAKE_CHECK_S,
    SEND_TIMEOUT_S,
    ClientError,
    ClientTimeout,
    RequestIds,
    RequestRefused,
    describe_ids,
    invalid_message_failure,
    requests_for,
)
from api.generation import Generation, GenerationBuilder, Prompt, refused
from api.request_group import RequestGroup
from core.sampling_params import SamplingParams
from ipc.codec import CodecError, decode, encode
from ipc.messages import (
    AbortRequest,
    CacheFlushed,
    FlushCache,
    GenerateRequest,
    OutputDelta,
    RequestAdmitted,
    RequestFailed,
    ServerInfo,
    ServerInfoQuery,
    TokenizerAnswer,
    TokenizerQuery,
)
from ipc.native_auth import HandshakeWatch, present_key
from procs.problem_log import ProblemLog

log = logging.getLogger(__name__)

_LINGER_MS = 200
_MAX_DRAIN = 256  # messages handled per wake-up before the event loop gets a turn


class AsyncClient:
    """An asyncio client; `async with AsyncClient(address) as client:` (see the module docstring)."""

    def __init__(self, address: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, name: str = "async client",
                 identity: bytes | None = None, id_prefix: str = "r", api_key: str | None = None) -> None:
        self.address = address
        self._api_key = api_key
        self._handshakes: HandshakeWatch | None = None
        self._handshake_watcher: asyncio.Task[None] | None = None
        self._problems = ProblemLog(log)
        self.timeout_s = timeout_s
        self.name = name
        self._identity = identity
        self._ids = RequestIds(id_prefix)
        self._socket: zmq.asyncio.Socket | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._groups: dict[str, RequestGroup] = {}  # unfinished request id -> its group
        self._failure: ClientError | None = None
        self._info: asyncio.Future[ServerInfo] | None = None
        self._info_asked_s = 0.0
        self._queries: dict[str, asyncio.Future[TokenizerAnswer | CacheFlushed]] = {}  # by query id

    async def __aenter__(self) -> AsyncClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._socket is not None:
            raise ClientError(f"{self.name} of {self.address} is already started")
        # A wrong address fails now, not after the whole timeout (a tcp one may take seconds to tell).
        await asyncio.to_thread(check_answers, self.address)
        # A shadow of the process-wide context: no context (and no I/O thread) per client.
        context = zmq.asyncio.Context.shadow(zmq.Context.instance().underlying)
        socket = context.socket(zmq.DEALER)
        socket.linger = _LINGER_MS
        socket.sndtimeo = int(SEND_TIMEOUT_S * 1000)
        if self._identity is not None:
            socket.routing_id = self._identity
        if self._api_key is not None:
            present_key(socket, self._api_key)
        if self._api_key is not None or self.address.startswith("tcp://"):
            self._handshakes = HandshakeWatch(socket)
            self._handshake_watcher = asyncio.create_task(self._watch_handshakes(),
                                                          name=f"{self.name} handshakes")
        try:
            socket.connect(self.address)
        except zmq.ZMQError as e:
            socket.close(linger=0)
            raise ClientError(f"{self.name}: cannot connect to the tokenizer at {self.address}: {e}") from e
        self._socket = socket
        self._dispatcher = asyncio.create_task(self._dispatch(), name=f"{self.name} dispatcher")

    async def close(self) -> None:
        """Abort every unfinished request, stop the dispatcher and close the socket."""
        if self._socket is None or self._socket.closed:
            return
        for group in {id(g): g for g in self._groups.values()}.values():
            group.close()
            group._deliver(None)
        for task in (self._dispatcher, self._handshake_watcher):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._handshakes is not None:
            self._handshakes.close()
        self._socket.close()

    # --- for callers that handle outputs themselves (the REST server) -----------------------------

    async def open(self, requests: Sequence[GenerateRequest]) -> RequestGroup:
        """Send the requests; their outputs arrive on the returned group's queue."""
        if self._socket is None:
            raise ClientError(f"{self.name} of {self.address} is not started")
        if self._failure is not None:
            raise self._failure
        taken = [r.request_id for r in requests if r.request_id in self._groups]
        if taken or len({r.request_id for r in requests}) != len(requests):
            raise ValueError(f"request ids {describe_ids(taken) or '(repeated in the call)'} are in use")
        group = RequestGroup(self, [r.request_id for r in requests])
        for request in requests:
            self._groups[request.request_id] = group
        try:
            for request in requests:
                await self._send(request)
        except BaseException:
            group.close()
            raise
        return group

    async def server_info(self, timeout_s: float | None = None) -> ServerInfo:
        """The server's state; concurrent callers share one query."""
        if self._failure is not None:
            raise self._failure
        timeout = self.timeout_s if timeout_s is None else timeout_s
        now = time.monotonic()
        if self._info is None or self._info.done() or now - self._info_asked_s > timeout:
            if self._info is None or self._info.done():
                self._info = asyncio.get_running_loop().create_future()
            self._info_asked_s = now
            await self._send(ServerInfoQuery())
        try:
            return await asyncio.wait_for(asyncio.shield(self._info), timeout)
        except TimeoutError:
            raise ClientTimeout(f"the tokenizer at {self.address} did not answer ServerInfoQuery within "
                                f"{timeout} s") from None

    async def ask_tokenizer(self, query: TokenizerQuery, timeout_s: float | None = None) -> TokenizerAnswer:
        """The tokenizer's answer to `query` (its query_id unique among those waiting)."""
        return await self._ask(query, f"a {query.kind} query", timeout_s)

    async def flush_cache(self, timeout_s: float | None = None) -> CacheFlushed:
        """Empty every replica's prefix cache; refused (flushed False, `error` says why) while any
        request runs or waits."""
        return await self._ask(FlushCache(uuid.uuid4().hex), "FlushCache", timeout_s)

    async def _ask(self, query: TokenizerQuery | FlushCache, what: str,
                   timeout_s: float | None) -> TokenizerAnswer | CacheFlushed:
        if self._failure is not None:
            raise self._failure
        if query.query_id in self._queries:
            raise ValueError(f"query id {query.query_id!r} is in use")
        timeout = self.timeout_s if timeout_s is None else timeout_s
        answer = self._queries[query.query_id] = asyncio.get_running_loop().create_future()
        try:
            await self._send(query)
            return await asyncio.wait_for(answer, timeout)
        except TimeoutError:
            raise ClientTimeout(f"the tokenizer at {self.address} did not answer {what} within "
                                f"{timeout} s") from None
        finally:
            del self._queries[query.query_id]

    # --- for batch jobs ----------------------------------------------------------------------------

    async def as_completed(self, prompts: Iterable[Prompt | GenerateRequest],
                           params: SamplingParams | None = None, *, timeout_s: float | None = None,
                           **options: bool) -> AsyncIterator[Generation]:
        """Submit every prompt; yield each one's Generation as it finishes."""
        requests = requests_for(self._ids, prompts, params, **options)
        builders = {r.request_id: GenerationBuilder(r.request_id) for r in requests}
        async with await self.open(requests) as group:
            while group.pending:
                message = await group.next(timeout_s)
                if isinstance(message, RequestFailed):
                    yield refused(message)
                    continue
                builder = builders[message.request_id]
                builder.add(message)
                if message.finished:
                    yield builder.build()

    async def generate(self, prompts: Iterable[Prompt | GenerateRequest],
                       params: SamplingParams | None = None, *, timeout_s: float | None = None,
                       **options: bool) -> list[Generation]:
        """Submit every prompt and wait for all; results in the prompts' order."""
        requests = requests_for(self._ids, prompts, params, **options)
        results = {g.request_id: g async for g in self.as_completed(requests, timeout_s=timeout_s)}
        return [results[r.request_id] for r in requests]

    async def stream(self, prompt: Prompt | GenerateRequest, params: SamplingParams | None = None,
                     *, timeout_s: float | None = None, **options: bool) -> AsyncIterator[OutputDelta]:
        """One request's outputs as they come; raises RequestRefused. Leaving early aborts it."""
        (request,) = requests_for(self._ids, [prompt], params, stream=True, **options)
        request = replace(request, stream=True)
        async with await self.open([request]) as group:
            while group.pending:
                message = await group.next(timeout_s)
                if isinstance(message, RequestFailed):
                    raise RequestRefused(message)
                yield message

    async def abort(self, request_id: str) -> None:
        """Cancel a request; its group then gets its last output, with finish_reason "abort"."""
        if request_id not in self._groups:
            raise KeyError(f"request {request_id!r} is not unfinished on {self.name}")
        await self._send(AbortRequest(request_id))

    # --- internals ---------------------------------------------------------------------------------

    async def _send(self, message: object) -> None:
        assert self._socket is not None
        if self._failure is not None:
            raise self._failure
        sending = asyncio.ensure_future(self._socket.send_multipart([encode(message)]))
        if self._handshake_watcher is not None and not sending.done():
            # A refused connection takes nothing: a send would wait out its timeout in vain.
            await asyncio.wait({sending, self._handshake_watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not sending.done() and self._failure is not None:
                sending.cancel()
                raise self._failure
        try:
            await sending
        except zmq.Again:
            raise ClientTimeout(f"the tokenizer at {self.address} did not take a {type(message).__name__} "
                                f"within {SEND_TIMEOUT_S} s (not running, or not reading)") from None

    def _send_soon(self, message: object) -> None:
        """Send without waiting: for aborts from cleanup code, which may run while being cancelled."""
        if self._socket is None or self._socket.closed:
            return
        future = self._socket.send_multipart([encode(message)])

        def report(done: asyncio.Future) -> None:
            if not done.cancelled() and done.exception() is not None:
                log.warning("%s: could not send %s to %s: %s", self.name, type(message).__name__,
                            self.address, done.exception())

        future.add_done_callback(report)

    async def _dispatch(self) -> None:
        assert self._socket is not None
        # The same socket, read synchronously: what is already queued is drained without an asyncio
        # future per message (a third of the dispatcher's time when hundreds of requests stream).
        queued = zmq.Socket.shadow(self._socket.underlying)
        try:
            while True:
                self._receive(await self._socket.recv_multipart())
                for _ in range(_MAX_DRAIN):
                    try:
                        frames = queued.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._receive(frames)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the socket broke: every waiter must hear of it
            self.fail(f"{self.name}: receiving from the tokenizer at {self.address} failed: {e}")

    async def _watch_handshakes(self) -> None:
        assert self._handshakes is not None
        while (refusal := self._handshakes.refusal()) is None:
            await asyncio.sleep(HANDSHAKE_CHECK_S)
        self.fail(f"{self.name}: the tokenizer at {self.address} {refusal}")

    def fail(self, reason: str) -> None:
        """The engine behind the tokenizer is gone (or the socket broke): every waiting request and
        every later call gets ClientError(reason) at once instead of waiting out its timeout."""
        if self._failure is not None:
            return
        self._failure = ClientError(reason)
        log.error("%s", reason)
        if self._info is not None and not self._info.done():
            self._info.set_exception(self._failure)
        for answer in self._queries.values():
            if not answer.done():
                answer.set_exception(self._failure)
        for group in {id(g): g for g in self._groups.values()}.values():
            group._deliver(None)

    def _receive(self, frames: list[bytes]) -> None:
        try:
            message = decode(frames[0])
        except CodecError as e:
            self._problems.warning(f"{self.name}: bad message from {self.address}", str(e))
            message = invalid_message_failure(e)
            if message is None:
                return
        self._route(message)

    def _route(self, message: object) -> None:
        if isinstance(message, ServerInfo):
            if self._info is not None and not self._info.done():
                self._info.set_result(message)
            return
        if isinstance(message, TokenizerAnswer | CacheFlushed):
            answer = self._queries.get(message.query_id)
            if answer is not None and not answer.done():
                answer.set_result(message)
            return
        if isinstance(message, RequestAdmitted):
            admitted = self._groups.get(message.request_id)
            if admitted is not None:
                admitted._admitted(message.request_id)
            return
        if not isinstance(message, OutputDelta | RequestFailed):
            log.warning("%s: unexpected %s from %s", self.name, type(message).__name__, self.address)
            return
        group = self._groups.get(message.request_id)
        if group is None:
            return  # a request its caller gave up on; late outputs are dropped
        if isinstance(message, RequestFailed) or message.finished:
            del self._groups[message.request_id]
        group._deliver(message)
