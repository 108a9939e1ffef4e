"""The native clients of a Cadence server: submit prompts over ZeroMQ, skipping HTTP.

Both talk to the tokenizer process's ROUTER (Launcher.endpoints.tokenizer_frontend) through one
DEALER socket, in the messages of ipc/messages.py, with request ids of their own:

* `Client` (here; sync, one thread) for batch jobs: `generate` many prompts and get them back in
  order, `submit` then iterate `as_completed`, `stream` one request's outputs, `abort`,
  `server_info`, `flush_cache` (empty the prefix caches between jobs, as /flush_cache does).
* `AsyncClient` (api/async_client.py, re-exported here) for the same from a coroutine, and for the
  REST server.

`SamplingParams(max_tokens=None)` asks for output up to the context: the tokenizer process fills
in max_model_len minus the prompt's tokens.

Over tcp (`cadence serve --native-tcp HOST:PORT`) to a server with an API key, give the same key:
`Client("tcp://host:5557", api_key=...)`. A refused key raises ClientError at once.

A client checks at once that something answers at its address (api/address_check.py): a wrong
address is a ClientError within seconds ("nothing answers at ipc://..."). Every wait has a timeout:
the longest silence a caller accepts (`timeout_s`, per call or the
client's default). When it passes, `ClientTimeout` names the tokenizer's address and the requests
that got nothing. A request the tokenizer refuses comes back as a Generation with `refused` set
(batch calls) or raises `RequestRefused` (single-request calls).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import replace

from api.address_check import check_answers
from api.async_client import AsyncClient
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
from ipc.channels import ChannelTimeout, DealerChannel
from ipc.codec import CodecError
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
)
from procs.problem_log import ProblemLog

__all__ = ["AsyncClient", "Client", "ClientError", "ClientTimeout", "RequestGroup", "RequestRefused"]

log = logging.getLogger(__name__)


class Client:
    """A blocking client for one thread; see the module docstring."""

    def __init__(self, address: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, name: str = "client",
                 identity: bytes | None = None, api_key: str | None = None) -> None:
        self.address = address
        check_answers(address)  # a wrong address fails now, not after the whole timeout
        self._problems = ProblemLog(log)
        self.timeout_s = timeout_s
        # Over tcp or with a key a refusal may come: sends wait in short turns that look for it.
        watched = api_key is not None or address.startswith("tcp://")
        self._channel = DealerChannel.connect(address, name=f"{name} -> tokenizer {address}",
                                              identity=identity, api_key=api_key,
                                              send_timeout_s=HANDSHAKE_CHECK_S if watched else SEND_TIMEOUT_S)
        self._refusal: str | None = None  # why the tokenizer refused this client's key, once it did
        self._ids = RequestIds("r")
        self._builders: dict[str, GenerationBuilder] = {}  # unfinished, collected whole
        self._streams: dict[str, deque[OutputDelta | RequestFailed]] = {}  # unfinished, streamed
        self._done: dict[str, Generation] = {}  # finished, not yet handed out
        self._infos: deque[ServerInfo] = deque()
        self._flushed: dict[str, CacheFlushed] = {}  # answers to this client's FlushCache, by query id

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Abort what is unfinished and close the socket."""
        if self._channel.closed:
            return
        if self._refused() is None:  # a refused connection took nothing, and nothing would go out
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
        requests = requests_for(self._ids, prompts, params, **options)
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
            raise KeyError(f"request(s) {describe_ids(unknown)} were not submitted on this client "
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
               *, timeout_s: float | None = None, **options: bool) -> Iterator[OutputDelta]:
        """One request's outputs as they come; raises RequestRefused if it is refused. Leaving the
        loop early aborts the request."""
        (request,) = requests_for(self._ids, [prompt], params, stream=True, **options)
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

    def flush_cache(self, timeout_s: float | None = None) -> CacheFlushed:
        """Empty every replica's prefix cache; refused (flushed False, `error` says why) while any
        request runs or waits."""
        query_id = uuid.uuid4().hex
        self._send(FlushCache(query_id))
        while query_id not in self._flushed:
            if not self._pump(timeout_s):
                raise ClientTimeout(f"the tokenizer at {self.address} did not answer FlushCache within "
                                    f"{self._timeout_s(timeout_s)} s")
        return self._flushed.pop(query_id)

    # --- internals ---------------------------------------------------------------------------------

    def _timeout_s(self, timeout_s: float | None) -> float:
        return self.timeout_s if timeout_s is None else timeout_s

    def _timeout(self, request_ids: Iterable[str], timeout_s: float | None) -> ClientTimeout:
        return ClientTimeout(f"the tokenizer at {self.address} sent nothing for request(s) "
                             f"{describe_ids(request_ids)} within {self._timeout_s(timeout_s)} s")

    def _send(self, message: object) -> None:
        deadline = time.monotonic() + SEND_TIMEOUT_S
        while True:
            self._raise_if_refused()
            try:
                self._channel.send(message)
                return
            except ChannelTimeout as e:
                if time.monotonic() >= deadline:
                    raise ClientTimeout(f"the tokenizer at {self.address} did not take a message within "
                                        f"{SEND_TIMEOUT_S} s: {e}") from e

    def _refused(self) -> str | None:
        """Why the tokenizer refused this client's connection (its API key), once it has."""
        if self._refusal is None and self._channel.handshakes is not None:
            self._refusal = self._channel.handshakes.refusal()
        return self._refusal

    def _raise_if_refused(self) -> None:
        if self._refused() is not None:
            raise ClientError(f"the tokenizer at {self.address} {self._refusal}")

    def _pump(self, timeout_s: float | None) -> bool:
        """Receive and route the messages that arrive within `timeout_s`; False if none came."""
        deadline = time.monotonic() + self._timeout_s(timeout_s)
        while True:
            wait_s = max(0.0, deadline - time.monotonic())
            if self._channel.handshakes is not None:  # over tcp or with a key: was it refused?
                self._raise_if_refused()
                wait_s = min(wait_s, HANDSHAKE_CHECK_S)
            try:
                message = self._channel.recv(wait_s)
            except CodecError as e:
                self._problems.warning(f"bad message from the tokenizer at {self.address}", str(e))
                failure = invalid_message_failure(e)
                if failure is None:
                    continue
                message = failure
            if message is None:
                if time.monotonic() < deadline:
                    continue
                return False
            self._route(message)
            return True

    def _route(self, message: object) -> None:
        if isinstance(message, ServerInfo):
            self._infos.append(message)
            return
        if isinstance(message, CacheFlushed):
            self._flushed[message.query_id] = message
            return
        if isinstance(message, RequestAdmitted):
            return  # asked for by a request built with notify_admitted; this client waits for outputs
        if not isinstance(message, OutputDelta | RequestFailed):
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
