"""One OpenAI API call, from its GenerateRequests to the response: whole, or as SSE events.

api/server.py parses a body (api/protocol.py), then makes a `CompletionCall` or `ChatCall` and
either `await call.collect()` (stream false: the response object) or iterates `call.events()`
(stream true: SSE bytes, ending with [DONE]). Both first `await call.start()`, which sends the
requests and waits until they can no longer be refused (a streamed call until the scheduler has
admitted them, so that its response starts during the prefill; a whole one until the first
output), so that a refused request (a prompt over the context length) still gets a plain 4xx
instead of a stream that starts and then fails. `close()` aborts whatever is unfinished; the
server calls it when the HTTP client goes away. With vLLM's `return_token_ids` the choices carry
their `token_ids` (a stream's per chunk) and the prompt's `prompt_token_ids` (a completion's in
its choices, a chat's beside them; a stream's in its first chunk).

A call sends every request with stream=True, streamed HTTP response or not: the per-output timings
feed the latency histograms (api/metrics.py), and an abort finds the request's text so far.

Errors: a refusal ends the call with its status and field; one that carries the numbers of a
context overflow (RequestFailed.context) is told from those numbers, naming the client's own field
(max_completion_tokens where the client used it). An output that carries `error` (the
engine ended the request) is a 500; a tokenizer that goes silent for the client's timeout is a
504 naming the tokenizer's address. Once a stream has started, the error is sent as an
`{"error": ...}` event, then [DONE]. With stream_options.continuous_usage_stats every chunk of
output carries the whole call's usage so far (vLLM's per-chunk usage, summed over the choices).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from api import responses
from api.async_client import AsyncClient
from api.choice_state import ChoiceState
from api.client_errors import ClientError, ClientTimeout
from api.errors import SERVER_ERROR, TIMEOUT, UNAVAILABLE, ApiError, error_object
from api.logprob_tokens import tokens_named_by_id
from api.metrics import ApiMetrics, RequestTiming
from api.protocol import ParsedRequest
from api.request_group import RequestGroup
from api.tool_call_parser import ToolCallParser
from ipc.messages import OutputDelta, RequestFailed


class _Call:
    """What both endpoints share; subclasses render choices, chunks and the response."""

    endpoint = ""

    def __init__(self, parsed: ParsedRequest, client: AsyncClient, metrics: ApiMetrics, call_id: str,
                 start_s: float) -> None:
        self.parsed = parsed
        self.call_id = call_id
        self.created = int(time.time())
        self._client = client
        self._group: RequestGroup | None = None
        self._peeked: deque[OutputDelta] = deque()
        is_chat = parsed.endpoint == "chat"
        tools = parsed.tools

        def tool_parser() -> ToolCallParser | None:
            return ToolCallParser(tools.parallel) if tools.parse_calls else None

        self._choices = {r.request_id: ChoiceState(i, RequestTiming(metrics, start_s), is_chat, tool_parser())
                         for i, r in enumerate(parsed.requests)}

    @property
    def stream(self) -> bool:
        return self.parsed.stream

    @property
    def choices(self) -> list[ChoiceState]:
        return sorted(self._choices.values(), key=lambda c: c.index)

    async def start(self) -> None:
        """Send the requests and wait until they cannot be refused any more (refusals raise ApiError
        here): a streamed call until the scheduler has admitted them, so that its response starts
        while the prefill runs; any other until the first output."""
        try:
            self._group = await self._client.open(self.parsed.requests)
            if self.parsed.stream:
                await self._group.settled()
        except ClientTimeout as e:
            raise ApiError(504, str(e), None, TIMEOUT) from None
        except ClientError as e:
            raise ApiError(503, str(e), None, UNAVAILABLE) from None
        if not self.parsed.stream or self._group.queued:
            self._peeked.append(await self._next())

    def close(self) -> None:
        """Abort whatever is unfinished (the HTTP client went away, or the call failed)."""
        if self._group is not None:
            self._group.close()
        now = time.monotonic()
        for choice in self._choices.values():
            if not choice.finished:
                choice.finished = True
                choice.timing.on_finish("abort", now)

    async def collect(self) -> dict[str, Any]:
        """Every output until all choices finish -> the response object."""
        while self._pending:
            output = await self._next()
            choice = self._choices[output.request_id]
            choice.update(output, time.monotonic())
            self._accumulate(choice, output)
            if output.error is not None:
                raise ApiError(500, f"the engine ended request {output.request_id}: {output.error}", None,
                               SERVER_ERROR)
        return self._response()

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE stream: opening chunks, a chunk per output, the usage chunk, [DONE]."""
        async for chunk in self.chunks():
            yield responses.sse(chunk)
        yield responses.SSE_DONE

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """What `events` sends, as objects: the chunks, or an `{"error": ...}` object that ends them
        (/v1/responses renders these as its own events)."""
        try:
            # The opening chunks go out with the first output, as vLLM's do, not with the headers.
            if not self._peeked and self._pending:
                try:
                    self._peeked.append(await self._next())
                except ApiError as e:
                    yield e.to_dict()
                    return
            for chunk in self._opening_chunks():
                yield chunk
            while self._pending:
                try:
                    output = await self._next()
                except ApiError as e:
                    yield e.to_dict()
                    return
                choice = self._choices[output.request_id]
                choice.update(output, time.monotonic())
                for chunk in self._chunks(choice, output):
                    if self.parsed.continuous_usage:
                        chunk["usage"] = self._usage()
                    yield chunk
                if output.error is not None:
                    yield error_object(f"the engine ended request {output.request_id}: {output.error}",
                                       SERVER_ERROR)
                    return
            if self.parsed.include_usage:
                yield self._chunk([], usage=self._usage())
        finally:
            self.close()

    @property
    def _pending(self) -> bool:
        return bool(self._peeked) or (self._group is not None and self._group.pending)

    async def _next(self) -> OutputDelta:
        """The next output of any choice; a refusal raises ApiError."""
        assert self._group is not None
        while True:
            if self._peeked:
                return self._peeked.popleft()
            try:
                message = await self._group.next()
            except ClientTimeout as e:
                raise ApiError(504, str(e), None, TIMEOUT) from None
            except ClientError as e:
                raise ApiError(503, str(e), None, UNAVAILABLE) from None
            if isinstance(message, OutputDelta):
                return tokens_named_by_id(self._visible(message)) if self.parsed.tokens_as_ids \
                    else self._visible(message)
            self._choices[message.request_id].finished = True  # refused: it never ran, no finish counted
            raise self._refusal_error(message)

    def _refusal_error(self, refusal: RequestFailed) -> ApiError:
        """The tokenizer's refusal as this API's error; a context overflow is told from its numbers."""
        if refusal.context is None:
            return ApiError(refusal.status, refusal.message, refusal.field)
        param = self.parsed.max_tokens_field if refusal.field == "max_tokens" else refusal.field
        return ApiError(refusal.status, refusal.context.describe(), param)

    def _usage(self) -> dict[str, Any]:
        choices = self.choices
        firsts = choices[:: self.parsed.n]  # the prompt is counted once per prompt, not per choice
        return responses.usage(sum(c.num_prompt_tokens for c in firsts),
                               sum(c.num_output_tokens for c in choices),
                               sum(c.num_cached_tokens for c in firsts))

    def _visible(self, output: OutputDelta) -> OutputDelta:
        """The output as the client sees it (an echo with max_tokens 0 hides the sampled token)."""
        return output

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def _opening_chunks(self) -> list[dict[str, Any]]:
        return []

    def _chunks(self, choice: ChoiceState, output: OutputDelta) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _accumulate(self, choice: ChoiceState, output: OutputDelta) -> None:
        raise NotImplementedError

    def _response(self) -> dict[str, Any]:
        raise NotImplementedError


class CompletionCall(_Call):
    """POST /v1/completions."""

    def _visible(self, output: OutputDelta) -> OutputDelta:
        if not self.parsed.echo_only:
            return output
        hidden = [] if output.logprobs is not None else None
        return dataclasses.replace(
            output, text="", token_ids=[], num_output_tokens=0, tokens=hidden, logprobs=hidden,
            top_logprobs=hidden, finish_reason="length" if output.finished else None, stop_reason=None)

    def _logprobs(self, choice: ChoiceState, output: OutputDelta) -> dict[str, Any] | None:
        """The output's logprobs part; with echo, the choice's first starts with the prompt's."""
        parts = []
        if self.parsed.echo and self.parsed.logprobs is not None and output.prompt_logprobs is not None:
            parts.append(responses.echoed_prompt_logprobs(output.prompt_logprobs))
            choice.text_offset = sum(len(t) for t in output.prompt_logprobs.tokens)
        if output.logprobs is not None:
            parts.append(responses.completion_logprobs(
                output.tokens or [], output.logprobs, output.top_logprobs or [[] for _ in output.logprobs],
                choice.text_offset))
            choice.text_offset += sum(len(t) for t in output.tokens or [])
        return responses.merge_completion_logprobs(parts) if parts else None

    def _echoed(self, choice: ChoiceState, output: OutputDelta) -> str:
        """The output's text, after the choice's prompt if the call echoes it and this is the
        choice's first; the first output also brings the prompt logprobs asked for."""
        if output.prompt_logprobs is not None and self.parsed.prompt_logprobs is not None:
            choice.prompt_logprobs = responses.prompt_logprobs_entries(output.prompt_logprobs,
                                                                       output.prompt_token_ids or [])
        if not self.parsed.echo or choice.echoed:
            return output.text
        choice.echoed = True
        prompt = self.parsed.requests[choice.index].prompt
        return (prompt if prompt is not None else output.prompt_text or "") + output.text

    def _accumulate(self, choice: ChoiceState, output: OutputDelta) -> None:
        if self.parsed.return_token_ids:  # the output's alone, echo or not (vLLM's)
            choice.token_ids += output.token_ids
        choice.text.append(self._echoed(choice, output))
        part = self._logprobs(choice, output)
        if part is not None:
            choice.logprobs.append(part)

    def _choice(self, choice: ChoiceState, text: str, finish_reason: str | None,
                stop_reason: str | int | None, logprobs: dict[str, Any] | None) -> dict[str, Any]:
        rendered = responses.completion_choice(choice.index, text, finish_reason, stop_reason, logprobs)
        if self.parsed.prompt_logprobs is not None:
            rendered["prompt_logprobs"] = choice.prompt_logprobs
        return rendered

    def _response(self) -> dict[str, Any]:
        choices = [
            self._choice(
                c, "".join(c.text), c.finish_reason, c.stop_reason,
                responses.merge_completion_logprobs(c.logprobs) if self.parsed.logprobs is not None else None)
            for c in self.choices
        ]
        if self.parsed.return_token_ids:
            for rendered, c in zip(choices, self.choices, strict=True):
                rendered["prompt_token_ids"], rendered["token_ids"] = c.prompt_token_ids, c.token_ids
        return responses.completion(self.call_id, self.created, self.parsed.model, choices, self._usage())

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        return responses.completion_chunk(self.call_id, self.created, self.parsed.model, choices,
                                          self.parsed.include_usage, usage)

    def _chunks(self, choice: ChoiceState, output: OutputDelta) -> list[dict[str, Any]]:
        logprobs = self._logprobs(choice, output)
        text = self._echoed(choice, output)
        if not (text or output.token_ids or output.finished):
            return []
        rendered = self._choice(choice, text, output.finish_reason, output.stop_reason, logprobs)
        if output.prompt_logprobs is None:
            rendered.pop("prompt_logprobs", None)  # the prompt's logprobs go out in the first chunk only
        if self.parsed.return_token_ids:
            if output.prompt_token_ids is not None:  # the first chunk only, as vLLM's
                rendered["prompt_token_ids"] = output.prompt_token_ids
            rendered["token_ids"] = list(output.token_ids)
        return [self._chunk([rendered])]


class ChatCall(_Call):
    """POST /v1/chat/completions; replies split into reasoning_content, content and (with tools)
    tool_calls, whose finish_reason "stop" becomes "tool_calls"."""

    def _split(self, choice: ChoiceState, output: OutputDelta) -> tuple[str, str, list[dict[str, Any]]]:
        assert choice.splitter is not None
        was_thinking = choice.splitter.thinking
        reasoning, content = choice.splitter.feed(output.text)
        if was_thinking or choice.splitter.thinking:
            choice.num_reasoning_tokens += len(output.token_ids)
        if output.finished:
            tail = choice.splitter.finish()
            reasoning, content = reasoning + tail.reasoning, content + tail.content
        if choice.tool_parser is None:
            return reasoning, content, []
        content, calls = choice.tool_parser.feed(content)
        if output.finished:
            tail_content, _ = choice.tool_parser.finish()
            content += tail_content
        return reasoning, content, calls

    @staticmethod
    def _finish_reason(choice: ChoiceState, finish_reason: str | None) -> str | None:
        called = choice.tool_parser is not None and choice.tool_parser.num_calls > 0
        return "tool_calls" if called and finish_reason == "stop" else finish_reason

    def _logprobs(self, output: OutputDelta) -> dict[str, Any] | None:
        if output.logprobs is None:
            return None
        return responses.chat_logprobs(output.tokens or [], output.logprobs,
                                       output.top_logprobs or [[] for _ in output.logprobs])

    def _accumulate(self, choice: ChoiceState, output: OutputDelta) -> None:
        if output.prompt_logprobs is not None and self.parsed.prompt_logprobs is not None:
            choice.prompt_logprobs = responses.prompt_logprobs_entries(output.prompt_logprobs,
                                                                       output.prompt_token_ids or [])
        reasoning, content, calls = self._split(choice, output)
        choice.reasoning.append(reasoning)
        choice.content.append(content)
        choice.tool_calls += calls
        if self.parsed.return_token_ids:
            choice.token_ids += output.token_ids
        part = self._logprobs(output)
        if part is not None:
            choice.logprobs.append(part)

    def _response(self) -> dict[str, Any]:
        choices = []
        for c in self.choices:
            logprobs = None
            if self.parsed.logprobs is not None:
                logprobs = {"content": [entry for part in c.logprobs for entry in part["content"]]}
            message = responses.chat_message("".join(c.content), "".join(c.reasoning) or None, c.tool_calls)
            choices.append(responses.chat_choice(c.index, message, self._finish_reason(c, c.finish_reason),
                                                 c.stop_reason, logprobs))
            if self.parsed.return_token_ids:
                choices[-1]["token_ids"] = c.token_ids
        reply = responses.chat_completion(self.call_id, self.created, self.parsed.model, choices,
                                          self._usage())
        if self.parsed.prompt_logprobs is not None:  # every choice has the same prompt
            reply["prompt_logprobs"] = self.choices[0].prompt_logprobs
        if self.parsed.return_token_ids:  # beside the choices, as vLLM's
            reply["prompt_token_ids"] = self.choices[0].prompt_token_ids
        return reply

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        return responses.chat_chunk(self.call_id, self.created, self.parsed.model, choices,
                                    self.parsed.include_usage, usage)

    def _opening_chunks(self) -> list[dict[str, Any]]:
        chunks = [self._chunk([responses.chat_delta_choice(c.index, {"role": "assistant", "content": ""})])
                  for c in self.choices]
        if self.parsed.return_token_ids and self._peeked:  # the first chunk, beside its choices (vLLM's)
            chunks[0]["prompt_token_ids"] = self._peeked[0].prompt_token_ids
        return chunks

    def _chunks(self, choice: ChoiceState, output: OutputDelta) -> list[dict[str, Any]]:
        reasoning, content, calls = self._split(choice, output)
        delta: dict[str, Any] = {}
        if reasoning:
            delta.update(responses.reasoning_fields(reasoning))
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        if not delta and output.token_ids and not output.text:
            # Tokens with no text yet (a character's first bytes, a special token) still get a
            # chunk, as on /v1/completions and from vLLM's server: a client timing tokens by chunks
            # (vLLM's `bench serve`) sees every step. Text a parser holds back gets none, as there.
            delta["content"] = ""
        logprobs = self._logprobs(output)
        with_ids = self.parsed.return_token_ids and bool(output.token_ids)  # every token goes out
        if not (delta or logprobs or output.finished or with_ids):
            return []
        finish_reason = self._finish_reason(choice, output.finish_reason)
        rendered = responses.chat_delta_choice(choice.index, delta, finish_reason, output.stop_reason,
                                               logprobs)
        if self.parsed.return_token_ids:
            rendered["token_ids"] = list(output.token_ids)
        return [self._chunk([rendered])]


def make_call(parsed: ParsedRequest, client: AsyncClient, metrics: ApiMetrics, call_id: str,
              start_s: float) -> _Call:
    cls = CompletionCall if parsed.endpoint == "completions" else ChatCall
    return cls(parsed, client, metrics, call_id, start_s)
