"""The native clients of a Cadence server: submit prompts over ZeroMQ, skipping HTTP.

Both talk to the tokenizer process's ROUTER (Launcher.endpoints.tokenizer_frontend) through one
DEALER socket, in the messages of procs/messages.py, with request ids of their own:

* `Client` (sync, one thread) for batch jobs: `generate` many prompts and get them back in order,
  `submit` then iterate `as_completed`, `stream` one request's outputs, `abort`, `server_info`.
* `AsyncClient` (asyncio, zmq.asyncio) for the same from a coroutine, and for api/server.py: one
  background task reads the socket and dispatches every output to the queue of its `RequestGroup`
  (the requests one caller sent together), so a caller waits on its own queue only.

Every wait has a timeout: the longest silence a caller accepts (`timeout_s`, per call or the
client's default). When it passes, `ClientTimeout` names the tokenizer's address and the requests
that got nothing. A request the tokenizer refuses comes back as a Generation with `refused` set
(batch calls) or raises `RequestRefused` (single-request calls).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import replace

import zmq
import zmq.asyncio

from api.generation import Generation, GenerationBuilder, Prompt, make_request, refused
from core.sampling_params import SamplingParams
from ipc.channels import ChannelTimeout, DealerChannel
from ipc.codec import CodecError, decode, encode
from procs.messages import (
    AbortRequest,
    GenerateOutput,
    GenerateRequest,
    RequestFailed,
    ServerInfo,
    ServerInfoQuery,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 120.0
_SEND_TIMEOUT_S = 10.0
_LINGER_MS = 200


class ClientError(RuntimeError):
    """Talking to the tokenizer failed (not a refusal of one request)."""


class ClientTimeout(ClientError, TimeoutError):
    """The tokenizer did not answer within the time asked; the message names its address and what."""


class RequestRefused(ClientError):
    """The tokenizer refused a request before running it (RequestFailed)."""

    def __init__(self, failure: RequestFailed) -> None:
        field = f" (field {failure.field})" if failure.field else ""
        super().__init__(f"request {failure.request_id} refused{field}: {failure.message}")
        self.failure = failure


def _describe_ids(ids: Iterable[str]) -> str:
    ids = sorted(ids)
    shown = ", ".join(ids[:3])
    return shown + (f" (+{len(ids) - 3} more)" if len(ids) > 3 else "")


class _RequestIds:
    """Ids for one connection's requests: a prefix and a counter, never reused."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter)}"


def _requests(ids: _RequestIds, prompts: Iterable[Prompt | GenerateRequest], params: SamplingParams | None,
              **options: bool) -> list[GenerateRequest]:
    params = params or SamplingParams()
    return [p if isinstance(p, GenerateRequest) else make_request(ids.next(), p, params, **options)
            for p in prompts]


# --- sync -----------------------------------------------------------------------------------------


class Client:
    """A blocking client for one thread; see the module docstring."""

    def __init__(self, address: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, name: str = "client",
                 identity: bytes | None = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = DealerChannel.connect(address, name=f"{name} -> tokenizer {address}",
                                              identity=identity, send_timeout_s=_SEND_TIMEOUT_S)
        self._ids = _RequestIds("r")
        self._builders: dict[str, GenerationBuilder] = {}  # unfinished, collected whole
        self._streams: dict[str, deque[GenerateOutput | RequestFailed]] = {}  # unfinished, streamed
        self._done: dict[str, Generation] = {}  # finished, not yet handed out
        self._infos: deque[ServerInfo] = deque()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Abort what is unfinished and close the socket."""
        if self._channel.closed:
            return
        for request_id in [*self._builders, *self._streams]:
            self._send(AbortRequest(request_id))
        self._channel.close()

    @property
    def num_unfinished(self) -> int:
        return len(self._builders) + len(self._streams)

    # --- submitting --------------------------------------------------------------------------------

    def submit(self, prompts: Iterable[Prompt | GenerateRequest], params: SamplingParams | None = None,
               **options: bool) -> list[str]:
        """Send one request per prompt (or GenerateRequest as is); returns their ids, in order.
        `options` are make_request's: detokenize, skip_special_tokens, enable_thinking."""
        requests = _requests(self._ids, prompts, params, **options)
        for request in requests:
            self._submit(request, streamed=False)
        return [r.request_id for r in requests]

    def _submit(self, request: GenerateRequest, *, streamed: bool) -> None:
        rid = request.request_id
        if rid in self._builders or rid in self._streams or rid in self._done:
            raise ValueError(f"request id {rid!r} is already in use on this client")
        if streamed:
            self._streams[rid] = deque()
        else:
            self._builders[rid] = GenerationBuilder(rid)
        self._send(request)

    def abort(self, request_id: str) -> None:
        """Cancel a request; it finishes with finish_reason "abort" (its outputs so far are kept)."""
        if request_id not in self._builders and request_id not in self._streams:
            raise KeyError(f"request {request_id!r} is not unfinished on this client")
        self._send(AbortRequest(request_id))

    # --- waiting -----------------------------------------------------------------------------------

    def as_completed(self, request_ids: Iterable[str] | None = None,
                     timeout_s: float | None = None) -> Iterator[Generation]:
        """Each request's Generation as it finishes (all submitted ones when `request_ids` is None).
        Raises ClientTimeout when nothing arrives for them within `timeout_s`."""
        wanted = set(self._builders) | set(self._done) if request_ids is None else set(request_ids)
        unknown = wanted - set(self._builders) - set(self._done)
        if unknown:
            raise KeyError(f"request(s) {_describe_ids(unknown)} were not submitted on this client "
                           f"(or were already returned)")
        while wanted:
            for rid in [r for r in wanted if r in self._done]:
                wanted.discard(rid)
                yield self._done.pop(rid)
            if wanted and not self._pump(timeout_s):
                raise self._timeout(wanted, timeout_s)

    def generate(self, prompts: Iterable[Prompt | GenerateRequest], params: SamplingParams | None = None,
                 *, timeout_s: float | None = None, **options: bool) -> list[Generation]:
        """Submit every prompt and wait for all of them; results in the prompts' order."""
        ids = self.submit(prompts, params, **options)
        results = {g.request_id: g for g in self.as_completed(ids, timeout_s)}
        return [results[rid] for rid in ids]

    def stream(self, prompt: Prompt | GenerateRequest, params: SamplingParams | None = None,
               *, timeout_s: float | None = None, **options: bool) -> Iterator[GenerateOutput]:
        """One request's outputs as they come; raises RequestRefused if it is refused. Leaving the
        loop early aborts the request."""
        (request,) = _requests(self._ids, [prompt], params, stream=True, **options)
        request = replace(request, stream=True)
        rid = request.request_id
        self._submit(request, streamed=True)
        queue = self._streams[rid]
        finished = False
        try:
            while not finished:
                while not queue and self._pump(timeout_s):
                    pass
                if not queue:
                    raise self._timeout([rid], timeout_s)
                message = queue.popleft()
                if isinstance(message, RequestFailed):
                    finished = True
                    raise RequestRefused(message)
                finished = message.finished
                yield message
        finally:
            self._streams.pop(rid, None)
            if not finished and not self._channel.closed:
                self._send(AbortRequest(rid))

    def server_info(self, timeout_s: float | None = None) -> ServerInfo:
        self._send(ServerInfoQuery())
        while not self._infos:
            if not self._pump(timeout_s):
                raise ClientTimeout(f"the tokenizer at {self.address} did not answer ServerInfoQuery within "
                                    f"{self._timeout_s(timeout_s)} s")
        return self._infos.popleft()

    # --- internals ---------------------------------------------------------------------------------

    def _timeout_s(self, timeout_s: float | None) -> float:
        return self.timeout_s if timeout_s is None else timeout_s

    def _timeout(self, request_ids: Iterable[str], timeout_s: float | None) -> ClientTimeout:
        return ClientTimeout(f"the tokenizer at {self.address} sent nothing for request(s) "
                             f"{_describe_ids(request_ids)} within {self._timeout_s(timeout_s)} s")

    def _send(self, message: object) -> None:
        try:
            self._channel.send(message)
        except ChannelTimeout as e:
            raise ClientTimeout(f"the tokenizer at {self.address} did not take a message: {e}") from e

    def _pump(self, timeout_s: float | None) -> bool:
        """Receive and route the messages that arrive within `timeout_s`; False if none came."""
        deadline = time.monotonic() + self._timeout_s(timeout_s)
        while True:
            try:
                message = self._channel.recv(max(0.0, deadline - time.monotonic()))
            except CodecError as e:
                log.warning("dropping a bad message from the tokenizer at %s: %s", self.address, e)
                continue
            if message is None:
                return False
            self._route(message)
            return True

    def _route(self, message: object) -> None:
        if isinstance(message, ServerInfo):
            self._infos.append(message)
            return
        if not isinstance(message, GenerateOutput | RequestFailed):
            log.warning("unexpected %s from the tokenizer at %s", type(message).__name__, self.address)
            return
        rid = message.request_id
        finished = isinstance(message, RequestFailed) or message.finished
        if rid in self._streams:
            self._streams[rid].append(message)
        elif rid in self._builders:
            if isinstance(message, RequestFailed):
                del self._builders[rid]
                self._done[rid] = refused(message)
                return
            builder = self._builders[rid]
            builder.add(message)
            if finished:
                del self._builders[rid]
                self._done[rid] = builder.build()
        # else: a request this client gave up on (a stream left early); its late outputs are dropped


# --- asyncio --------------------------------------------------------------------------------------


class RequestGroup:
    """Requests sent together (the n choices of one API call) whose outputs share one queue.

    `next()` returns the group's next GenerateOutput or RequestFailed; `async for` yields them
    until every request has finished. Leaving `async with` (or `close()`) aborts what is unfinished
    and forgets it: a caller that goes away never leaves a request running.
    """

    def __init__(self, client: AsyncClient, request_ids: Sequence[str]) -> None:
        self._client = client
        self.request_ids = tuple(request_ids)
        self.unfinished = set(self.request_ids)
        self._queue: asyncio.Queue[GenerateOutput | RequestFailed | None] = asyncio.Queue()
        self._closed = False

    async def __aenter__(self) -> RequestGroup:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> AsyncIterator[GenerateOutput | RequestFailed]:
        return self._iterate()

    @property
    def pending(self) -> bool:
        """Some request is unfinished, or some output is not yet taken."""
        return bool(self.unfinished) or not self._queue.empty()

    async def _iterate(self) -> AsyncIterator[GenerateOutput | RequestFailed]:
        while self.pending:
            yield await self.next()

    async def next(self, timeout_s: float | None = None) -> GenerateOutput | RequestFailed:
        timeout = self._client.timeout_s if timeout_s is None else timeout_s
        try:
            message = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            waiting = self.unfinished or self.request_ids
            raise ClientTimeout(f"the tokenizer at {self._client.address} sent nothing for request(s) "
                                f"{_describe_ids(waiting)} within {timeout} s") from None
        if message is None:
            raise self._client._failure or ClientError(f"client of {self._client.address} is closed")
        return message

    async def resubmit(self, request: GenerateRequest) -> None:
        """Send a finished (e.g. refused) member again under its id."""
        if request.request_id not in self.request_ids or request.request_id in self.unfinished:
            raise ValueError(f"request {request.request_id!r} is not a finished member of this group")
        self.unfinished.add(request.request_id)
        self._client._groups[request.request_id] = self
        await self._client._send(request)

    def abort(self) -> None:
        """Ask the server to end every unfinished request; each then finishes with "abort"."""
        for rid in self.unfinished:
            self._client._send_soon(AbortRequest(rid))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.abort()
        for rid in self.unfinished:
            self._client._groups.pop(rid, None)
        self.unfinished.clear()

    def _deliver(self, message: GenerateOutput | RequestFailed | None) -> None:
        if message is not None and (isinstance(message, RequestFailed) or message.finished):
            self.unfinished.discard(message.request_id)
        self._queue.put_nowait(message)


class AsyncClient:
    """An asyncio client; `async with AsyncClient(address) as client:` (see the module docstring)."""

    def __init__(self, address: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, name: str = "async client",
                 identity: bytes | None = None, id_prefix: str = "r") -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.name = name
        self._identity = identity
        self._ids = _RequestIds(id_prefix)
        self._socket: zmq.asyncio.Socket | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._groups: dict[str, RequestGroup] = {}  # unfinished request id -> its group
        self._failure: ClientError | None = None
        self._info: asyncio.Future[ServerInfo] | None = None
        self._info_asked_s = 0.0

    async def __aenter__(self) -> AsyncClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._socket is not None:
            raise ClientError(f"{self.name} of {self.address} is already started")
        # A shadow of the process-wide context: no context (and no I/O thread) per client.
        context = zmq.asyncio.Context.shadow(zmq.Context.instance().underlying)
        socket = context.socket(zmq.DEALER)
        socket.linger = _LINGER_MS
        socket.sndtimeo = int(_SEND_TIMEOUT_S * 1000)
        if self._identity is not None:
            socket.routing_id = self._identity
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
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
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
            raise ValueError(f"request ids {_describe_ids(taken) or '(repeated in the call)'} are in use")
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

    # --- for batch jobs ----------------------------------------------------------------------------

    async def as_completed(self, prompts: Iterable[Prompt | GenerateRequest],
                           params: SamplingParams | None = None, *, timeout_s: float | None = None,
                           **options: bool) -> AsyncIterator[Generation]:
        """Submit every prompt; yield each one's Generation as it finishes."""
        requests = _requests(self._ids, prompts, params, **options)
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
        requests = _requests(self._ids, prompts, params, **options)
        results = {g.request_id: g async for g in self.as_completed(requests, timeout_s=timeout_s)}
        return [results[r.request_id] for r in requests]

    async def stream(self, prompt: Prompt | GenerateRequest, params: SamplingParams | None = None,
                     *, timeout_s: float | None = None, **options: bool) -> AsyncIterator[GenerateOutput]:
        """One request's outputs as they come; raises RequestRefused. Leaving early aborts it."""
        (request,) = _requests(self._ids, [prompt], params, stream=True, **options)
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
        try:
            await self._socket.send_multipart([encode(message)])
        except zmq.Again:
            raise ClientTimeout(f"the tokenizer at {self.address} did not take a {type(message).__name__} "
                                f"within {_SEND_TIMEOUT_S} s (not running, or not reading)") from None

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
        try:
            while True:
                frames = await self._socket.recv_multipart()
                try:
                    message = decode(frames[0])
                except CodecError as e:
                    log.warning("%s: dropping a bad message from %s: %s", self.name, self.address, e)
                    continue
                self._route(message)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the socket broke: every waiter must hear of it
            self._failure = ClientError(f"{self.name}: receiving from the tokenizer at {self.address} "
                                        f"failed: {e}")
            log.error("%s", self._failure)
            for group in {id(g): g for g in self._groups.values()}.values():
                group._deliver(None)

    def _route(self, message: object) -> None:
        if isinstance(message, ServerInfo):
            if self._info is not None and not self._info.done():
                self._info.set_result(message)
            return
        if not isinstance(message, GenerateOutput | RequestFailed):
            log.warning("%s: unexpected %s from %s", self.name, type(message).__name__, self.address)
            return
        group = self._groups.get(message.request_id)
        if group is None:
            return  # a request its caller gave up on; late outputs are dropped
        if isinstance(message, RequestFailed) or message.finished:
            del self._groups[message.request_id]
        group._deliver(message)
