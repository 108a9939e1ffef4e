"""How the native clients (api/client.py, api/async_client.py) fail, and what they share.

`ClientTimeout` is raised when the tokenizer does not answer within the time asked, and names its
address and the requests that got nothing; `RequestRefused` when it refused one request
(RequestFailed) and the caller asked for that request alone; `ClientError` for the rest. Request
ids come from `RequestIds`, and prompts become GenerateRequests through `requests_for`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from api.generation import Prompt, make_request
from core.sampling_params import SamplingParams
from ipc.codec import CodecError
from ipc.messages import GenerateRequest, RequestFailed

DEFAULT_TIMEOUT_S = 120.0  # the longest silence a native client waits through by default
SEND_TIMEOUT_S = 10.0
HANDSHAKE_CHECK_S = 0.1  # how often a client with an API key looks for a refused handshake


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


def invalid_message_failure(error: CodecError) -> RequestFailed | None:
    """A message from the tokenizer that does not decode ends the request it names (502, with what
    was wrong) instead of leaving its caller waiting; None when it names none."""
    request_id = error.names.get("request_id")
    if not isinstance(request_id, str):
        return None
    return RequestFailed(request_id, f"the tokenizer sent an invalid message for this request: {error}",
                         None, 502)


def describe_ids(ids: Iterable[str]) -> str:
    """A few of the ids, for an error message."""
    ids = sorted(ids)
    shown = ", ".join(ids[:3])
    return shown + (f" (+{len(ids) - 3} more)" if len(ids) > 3 else "")


class RequestIds:
    """Ids for one connection's requests: a prefix and a counter, never reused."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter)}"


def requests_for(ids: RequestIds, prompts: Iterable[Prompt | GenerateRequest], params: SamplingParams | None,
                 **options: bool) -> list[GenerateRequest]:
    """One GenerateRequest per prompt (a GenerateRequest is taken as is)."""
    params = params or SamplingParams()
    return [p if isinstance(p, GenerateRequest) else make_request(ids.next(), p, params, **options)
            for p in prompts]
