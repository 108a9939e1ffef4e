"""One POST /v1/messages call: a ChatCall (api/openai_serving.py) whose reply is rendered as an
Anthropic message, whole or as the Messages API's SSE events.

The reply's parts become content blocks in order: its reasoning a `thinking` block (no signature:
nothing here is sealed), its answer a `text` block, each function call a `tool_use` block (`input`
the call's arguments as an object). `stop_reason`: `tool_use` after a call, `max_tokens` when cut,
`stop_sequence` (named in `stop_sequence`) when one of the request's ended it, else `end_turn`.

Streamed: `message_start` (with the prompt's tokens), then per block `content_block_start`, its
deltas (`thinking_delta`, `text_delta`, or the call's whole `input_json_delta`) and
`content_block_stop`; last `message_delta` (stop reason, output tokens) and `message_stop`. An
error once the stream has started is an `error` event. Errors before it are Anthropic's error
object (`anthropic_error`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson

from api.anthropic_request import MessagesRequest
from api.chat_dialect import ChatDialectCall, reply_parts
from api.errors import ApiError
from api.json_response import JSONResponse
from api.openai_serving import ChatCall


def _sse(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError:
        arguments = {}
    return {"type": "tool_use", "id": call["id"], "name": function["name"],
            "input": arguments if isinstance(arguments, dict) else {}}


class _Blocks:
    """The content blocks of a reply as they grow, and the events that announce them."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self.open: str | None = None  # "thinking" or "text" while such a block takes deltas

    def text(self, kind: str, delta: str) -> list[dict[str, Any]]:
        events = []
        if self.open != kind:
            events += self.close()
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else \
                {"type": "text", "text": ""}
            self.blocks.append(block)
            self.open = kind
            events.append({"type": "content_block_start", "index": len(self.blocks) - 1,
                           "content_block": dict(block)})
        self.blocks[-1][kind] += delta
        delta_type = "thinking_delta" if kind == "thinking" else "text_delta"
        return [*events, {"type": "content_block_delta", "index": len(self.blocks) - 1,
                          "delta": {"type": delta_type, kind: delta}}]

    def close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]

    def add(self, kind: str, value: Any) -> list[dict[str, Any]]:
        """A part of the reply (api/chat_dialect.py `reply_parts`): its events."""
        if kind == "call":
            return self.call(value)
        return self.text("thinking" if kind == "reasoning" else "text", value)

    def call(self, tool_call: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.close()
        block = _tool_use(tool_call)
        self.blocks.append(block)
        index = len(self.blocks) - 1
        return [*events,
                {"type": "content_block_start", "index": index, "content_block": block | {"input": {}}},
                {"type": "content_block_delta", "index": index,
                 "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}},
                {"type": "content_block_stop", "index": index}]


class MessagesCall(ChatDialectCall):
    """POST /v1/messages, served as the chat completion `request.chat_body` asks for."""

    def __init__(self, request: MessagesRequest, chat: ChatCall) -> None:
        super().__init__(chat)
        self.request = request
        self.message_id = f"msg_{uuid.uuid4().hex}"

    async def collect(self) -> dict[str, Any]:
        choice, usage = await self.whole_reply()
        blocks = _Blocks()
        for kind, value in reply_parts(choice["message"]):
            blocks.add(kind, value)
        stop = self._stop(choice["finish_reason"], choice.get("stop_reason"))
        return self._message(blocks.blocks, *stop, usage["prompt_tokens"], usage["completion_tokens"],
                             usage["prompt_tokens_details"]["cached_tokens"])

    async def events(self) -> AsyncIterator[bytes]:
        blocks = _Blocks()
        started = False
        stop: tuple[str | None, str | None] = (None, None)
        output_tokens = 0
        async for chunk in self.chat.chunks():
            if "error" in chunk:
                error = {"type": "api_error", "message": chunk["error"]["message"]}
                yield _sse({"type": "error", "error": error})
                return
            if chunk.get("usage") is not None:
                output_tokens = chunk["usage"]["completion_tokens"]
            events = []
            for choice in chunk["choices"]:
                parts = list(reply_parts(choice["delta"]))
                if not started and (parts or choice.get("finish_reason")):
                    started = True
                    events.append(self._start_event())
                for kind, value in parts:
                    events += blocks.add(kind, value)
                if choice.get("finish_reason") is not None:
                    stop = self._stop(choice["finish_reason"], choice.get("stop_reason"))
                    events += blocks.close()
            for event in events:
                yield _sse(event)
        if not started:
            yield _sse(self._start_event())
        yield _sse({"type": "message_delta", "delta": {"stop_reason": stop[0], "stop_sequence": stop[1]},
                    "usage": {"output_tokens": output_tokens}})
        yield _sse({"type": "message_stop"})

    def _start_event(self) -> dict[str, Any]:
        choices = self.chat.choices
        prompt, cached = (choices[0].num_prompt_tokens, choices[0].num_cached_tokens) if choices else (0, 0)
        return {"type": "message_start", "message": self._message([], None, None, prompt, 0, cached)}

    def _stop(self, finish_reason: str | None, stop_reason: Any) -> tuple[str | None, str | None]:
        if finish_reason == "tool_calls":
            return "tool_use", None
        if finish_reason == "length":
            return "max_tokens", None
        if isinstance(stop_reason, str) and stop_reason in self.request.stop_sequences:
            return "stop_sequence", stop_reason
        return ("end_turn" if finish_reason is not None else None), None

    def _message(self, blocks: list[dict[str, Any]], stop_reason: str | None, stop_sequence: str | None,
                 input_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
        return {"id": self.message_id, "type": "message", "role": "assistant",
                "model": self.chat.parsed.model, "content": [dict(block) for block in blocks],
                "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                # Anthropic counts cache reads apart from input_tokens.
                "usage": {"input_tokens": input_tokens - cached_tokens, "output_tokens": output_tokens,
                          "cache_read_input_tokens": cached_tokens, "cache_creation_input_tokens": 0}}


def anthropic_error(e: ApiError) -> JSONResponse:
    """An ApiError in Anthropic's error object, its type by the status."""
    kinds = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large",
             429: "rate_limit_error", 503: "overloaded_error", 504: "api_error"}
    kind = kinds.get(e.status, "invalid_request_error" if e.status < 500 else "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": e.message}},
                        status_code=e.status)
