"""RequestGroup: the requests one caller sent together through an AsyncClient (the n choices of an
API call), whose outputs share one queue; api/async_client.py routes each output to its group."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from api.client_errors import ClientError, ClientTimeout, describe_ids
from ipc.messages import AbortRequest, OutputDelta, RequestFailed

if TYPE_CHECKING:
    from api.async_client import AsyncClient


class RequestGroup:
    """Requests sent together (the n choices of one API call) whose outputs share one queue.

    `next()` returns the group's next OutputDelta or RequestFailed; `async for` yields them
    until every request has finished. Leaving `async with` (or `close()`) aborts what is unfinished
    and forgets it: a caller that goes away never leaves a request running. For requests built with
    `notify_admitted`, `settled()` returns once the scheduler has taken them all (they will not be
    refused), or once something is queued for `next()`.
    """

    def __init__(self, client: AsyncClient, request_ids: Sequence[str]) -> None:
        self._client = client
        self.request_ids = tuple(request_ids)
        self.unfinished = set(self.request_ids)
        self._queue: asyncio.Queue[OutputDelta | RequestFailed | None] = asyncio.Queue()
        self._closed = False
        self._unadmitted = set(self.request_ids)
        self._settled = asyncio.Event()

    async def __aenter__(self) -> RequestGroup:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> AsyncIterator[OutputDelta | RequestFailed]:
        return self._iterate()

    @property
    def pending(self) -> bool:
        """Some request is unfinished, or some output is not yet taken."""
        return bool(self.unfinished) or not self._queue.empty()

    async def _iterate(self) -> AsyncIterator[OutputDelta | RequestFailed]:
        while self.pending:
            yield await self.next()

    async def next(self, timeout_s: float | None = None) -> OutputDelta | RequestFailed:
        timeout = self._client.timeout_s if timeout_s is None else timeout_s
        try:
            # An output already queued needs no timer: the common case while a request streams.
            message = self._queue.get_nowait() if not self._queue.empty() else await asyncio.wait_for(
                self._queue.get(), timeout)
        except TimeoutError:
            waiting = self.unfinished or self.request_ids
            raise ClientTimeout(f"the tokenizer at {self._client.address} sent nothing for request(s) "
                                f"{describe_ids(waiting)} within {timeout} s") from None
        if message is None:
            raise self._client._failure or ClientError(f"client of {self._client.address} is closed")
        return message

    @property
    def queued(self) -> bool:
        """Some output or refusal waits for `next()`."""
        return not self._queue.empty()

    async def settled(self, timeout_s: float | None = None) -> None:
        """Until every request is admitted (each was sent with notify_admitted) or something is
        queued for `next()`: an output, a refusal, or the client's end."""
        if self._settled.is_set():
            return
        timeout = self._client.timeout_s if timeout_s is None else timeout_s
        try:
            await asyncio.wait_for(self._settled.wait(), timeout)
        except TimeoutError:
            raise ClientTimeout(f"the tokenizer at {self._client.address} did not admit request(s) "
                                f"{describe_ids(self._unadmitted)} within {timeout} s") from None

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

    def _deliver(self, message: OutputDelta | RequestFailed | None) -> None:
        if message is not None and (isinstance(message, RequestFailed) or message.finished):
            self.unfinished.discard(message.request_id)
        self._queue.put_nowait(message)
        self._settled.set()

    def _admitted(self, request_id: str) -> None:
        self._unadmitted.discard(request_id)
        if not self._unadmitted:
            self._settled.set()
