"""What the native clients hand their users: one request's whole result, and how prompts become requests.

`Generation` is the finished result of one GenerateRequest, merged from its OutputDeltas by a
`GenerationBuilder` (or a refusal, when the tokenizer sent RequestFailed instead). `make_request`
turns what a batch job has (a string, token ids or a chat) into a GenerateRequest. Used by
api/client.py (Client, AsyncClient); the REST server builds its own requests in api/protocol.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from core.sampling_params import SamplingParams
from ipc.messages import (
    ChatTurn,
    GenerateRequest,
    OutputDelta,
    PromptTokenLogprobs,
    RequestFailed,
    TopLogprob,
)

Prompt = str | Sequence[int] | Sequence[ChatTurn]


@dataclass(frozen=True)
class Generation:
    """Everything one request produced; `refused` is set (and nothing else) when it never ran."""

    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    finish_reason: str | None = None  # "stop", "length" or "abort"
    stop_reason: str | int | None = None
    error: str | None = None  # why the server ended it, when it did
    tokens: list[str] | None = None  # per token, when logprobs were asked for
    logprobs: list[float] | None = None
    top_logprobs: list[list[TopLogprob]] | None = None
    prompt_logprobs: PromptTokenLogprobs | None = None  # when SamplingParams.prompt_logprobs was set
    refused: RequestFailed | None = None

    @property
    def ok(self) -> bool:
        """It ran to a stop or to its length limit."""
        return self.refused is None and self.error is None and self.finish_reason in ("stop", "length")

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids)


class GenerationBuilder:
    """Merges one request's OutputDeltas, in order, into a Generation."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._text: list[str] = []
        self._token_ids: list[int] = []
        self._tokens: list[str] = []
        self._logprobs: list[float] = []
        self._top: list[list[TopLogprob]] = []
        self._has_logprobs = False
        self._last: OutputDelta | None = None
        self._prompt_token_ids: list[int] | None = None
        self._prompt_logprobs: PromptTokenLogprobs | None = None

    @property
    def finished(self) -> bool:
        return self._last is not None and self._last.finished

    def add(self, output: OutputDelta) -> None:
        if output.request_id != self.request_id:
            raise ValueError(
                f"output of request {output.request_id!r} given to the builder of {self.request_id!r}"
            )
        if self.finished:
            raise ValueError(f"request {self.request_id!r} got an output after its last one")
        self._text.append(output.text)
        self._token_ids.extend(output.token_ids)
        if output.prompt_token_ids is not None:
            self._prompt_token_ids = output.prompt_token_ids
        if output.prompt_logprobs is not None:
            self._prompt_logprobs = output.prompt_logprobs
        if output.logprobs is not None:
            self._has_logprobs = True
            self._logprobs.extend(output.logprobs)
            self._tokens.extend(output.tokens or [])
            self._top.extend(output.top_logprobs or [[] for _ in output.logprobs])
        self._last = output

    def build(self) -> Generation:
        last = self._last
        return Generation(
            request_id=self.request_id,
            text="".join(self._text),
            token_ids=list(self._token_ids),
            prompt_token_ids=self._prompt_token_ids,
            num_prompt_tokens=last.num_prompt_tokens if last else 0,
            num_cached_tokens=last.num_cached_tokens if last else 0,
            finish_reason=last.finish_reason if last else None,
            stop_reason=last.stop_reason if last else None,
            error=last.error if last else None,
            tokens=list(self._tokens) if self._has_logprobs else None,
            logprobs=list(self._logprobs) if self._has_logprobs else None,
            top_logprobs=list(self._top) if self._has_logprobs else None,
            prompt_logprobs=self._prompt_logprobs,
        )


def refused(failure: RequestFailed) -> Generation:
    return Generation(request_id=failure.request_id, error=failure.message, refused=failure)


def make_request(
    request_id: str,
    prompt: Prompt,
    params: SamplingParams,
    *,
    stream: bool = False,
    detokenize: bool = True,
    skip_special_tokens: bool = True,
    enable_thinking: bool = True,
) -> GenerateRequest:
    """A GenerateRequest for a text prompt, a token-id prompt, or a chat (a sequence of ChatTurn)."""
    if isinstance(prompt, str):
        kind = {"prompt": prompt}
    elif prompt and all(isinstance(t, ChatTurn) for t in prompt):
        kind = {"messages": list(prompt)}
    elif all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        kind = {"prompt_token_ids": [int(t) for t in prompt]}
    else:
        raise TypeError(
            f"request {request_id}: a prompt is a string, a sequence of token ids or a sequence of ChatTurn; "
            f"got {type(prompt).__name__} of {sorted({type(t).__name__ for t in prompt})}"
        )
    return GenerateRequest(
        request_id=request_id,
        params=params,
        stream=stream,
        detokenize=detokenize,
        skip_special_tokens=skip_special_tokens,
        enable_thinking=enable_thinking,
        **kind,
    )
