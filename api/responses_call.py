"""One POST /v1/responses call: a ChatCall (api/openai_serving.py) whose reply is rendered as a
Responses object, whole or as the Responses API's SSE events.

The reply's parts become output items in order: its reasoning a `reasoning` item (the text as
`reasoning_text` content), its answer a `message` item with one `output_text` part, each function
call a `function_call` item (`call_id` the chat reply's tool call id). A reply cut by
max_output_tokens is `incomplete` with reason `max_output_tokens`.

Streamed: `response.created` and `response.in_progress`, then per item `response.output_item.added`,
its content part's `added` / deltas / `done` (`response.reasoning_text.*`, `response.output_text.*`,
or `response.function_call_arguments.*`), `response.output_item.done`; last
`response.completed` (or `response.incomplete`) with the whole response. Every event has its
`sequence_number` and no `[DONE]` follows, as from OpenAI. An error once the stream has started
is a `response.failed` event with the error.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson

from api.chat_dialect import ChatDialectCall, reply_parts
from api.openai_serving import ChatCall
from api.responses_request import ResponsesRequest


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _sse(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class _Output:
    """The output items of a reply as they grow: the reasoning, the message, the function calls."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the reasoning or message item text is going into

    def start(self, kind: str) -> list[dict[str, Any]]:
        """Open a reasoning or message item: the events that announce it and its content part."""
        if kind == "reasoning":
            item = {"id": _item_id("rs"), "type": "reasoning", "summary": [], "content": [],
                    "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {"id": _item_id("msg"), "type": "message", "role": "assistant", "content": [],
                    "status": "in_progress"}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self.items.append(item)
        self.open = item
        index = len(self.items) - 1
        events = [{"type": "response.output_item.added", "output_index": index, "item": _copy(item)},
                  {"type": "response.content_part.added", "item_id": item["id"], "output_index": index,
                   "content_index": 0, "part": dict(part)}]
        item["content"].append(part)
        return events

    def text(self, kind: str, delta: str) -> list[dict[str, Any]]:
        """`delta` into the open item of `kind`, opening it (and closing another) first."""
        events = []
        if self.open is None or self.open["type"] != kind:
            events += self.close()
            events += self.start(kind)
        item = self.open
        assert item is not None
        item["content"][0]["text"] += delta
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        event = {"type": name, "item_id": item["id"], "output_index": len(self.items) - 1, "content_index": 0,
                 "delta": delta}
        if kind == "message":
            event["logprobs"] = []
        return [*events, event]

    def close(self, status: str = "completed") -> list[dict[str, Any]]:
        """Close the open item, if any: its part's and its own `done` events."""
        item, self.open = self.open, None
        if item is None:
            return []
        item["status"] = status
        index = self.items.index(item)
        part = item["content"][0]
        kind = "reasoning_text" if item["type"] == "reasoning" else "output_text"
        done = {"type": f"response.{kind}.done", "item_id": item["id"], "output_index": index,
                "content_index": 0, "text": part["text"]}
        if kind == "output_text":
            done["logprobs"] = []
        return [done, {"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                       "content_index": 0, "part": dict(part)},
                {"type": "response.output_item.done", "output_index": index, "item": _copy(item)}]

    def add(self, kind: str, value: Any) -> list[dict[str, Any]]:
        """A part of the reply (api/chat_dialect.py `reply_parts`): its events."""
        if kind == "call":
            return self.call(value)
        return self.text("reasoning" if kind == "reasoning" else "message", value)

    def call(self, tool_call: dict[str, Any]) -> list[dict[str, Any]]:
        """A whole function call (the parser gives them whole): its item's four events."""
        events = self.close()
        function = tool_call["function"]
        item = {"id": _item_id("fc"), "type": "function_call", "call_id": tool_call["id"],
                "name": function["name"], "arguments": function["arguments"], "status": "completed"}
        self.items.append(item)
        index = len(self.items) - 1
        return [*events,
                {"type": "response.output_item.added", "output_index": index,
                 "item": item | {"arguments": "", "status": "in_progress"}},
                {"type": "response.function_call_arguments.delta", "item_id": item["id"],
                 "output_index": index, "delta": item["arguments"]},
                {"type": "response.function_call_arguments.done", "item_id": item["id"],
                 "output_index": index, "name": item["name"], "arguments": item["arguments"]},
                {"type": "response.output_item.done", "output_index": index, "item": dict(item)}]


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return item | {"content": [dict(part) for part in item.get("content", [])]}


class ResponsesCall(ChatDialectCall):
    """POST /v1/responses, served as the chat completion `request.chat_body` asks for."""

    def __init__(self, request: ResponsesRequest, chat: ChatCall) -> None:
        super().__init__(chat)
        self.request = request
        if chat.parsed.max_tokens_field == "max_completion_tokens":  # a refusal names the client's field
            chat.parsed = dataclasses.replace(chat.parsed, max_tokens_field="max_output_tokens")
        self.response_id = _item_id("resp")
        self.created = int(time.time())

    async def collect(self) -> dict[str, Any]:
        choice, usage = await self.whole_reply()
        output = _Output()
        for kind, value in reply_parts(choice["message"]):
            output.add(kind, value)
        output.close("incomplete" if choice["finish_reason"] == "length" else "completed")
        return self._response(output.items, choice["finish_reason"], usage)

    async def events(self) -> AsyncIterator[bytes]:
        sequence = 0

        def numbered(events: list[dict[str, Any]]) -> list[bytes]:
            nonlocal sequence
            sent = []
            for event in events:
                sent.append(_sse({"type": event["type"], "sequence_number": sequence, **event}))
                sequence += 1
            return sent

        opening = self._response([], None, None, status="in_progress")
        for event in numbered([{"type": "response.created", "response": opening},
                               {"type": "response.in_progress", "response": opening}]):
            yield event
        output = _Output()
        finish_reason, usage = None, None
        async for chunk in self.chat.chunks():
            if "error" in chunk:
                failed = self._response(output.items, None, usage, status="failed")
                failed["error"] = chunk["error"]
                for event in numbered([{"type": "response.failed", "response": failed}]):
                    yield event
                return
            if chunk.get("usage") is not None:
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                events = []
                for kind, value in reply_parts(choice["delta"]):
                    events += output.add(kind, value)
                if choice.get("finish_reason") is not None:
                    finish_reason = choice["finish_reason"]
                    events += output.close("incomplete" if finish_reason == "length" else "completed")
                for event in numbered(events):
                    yield event
        final = self._response(output.items, finish_reason, usage)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        for event in numbered([{"type": kind, "response": final}]):
            yield event

    def _response(self, items: list[dict[str, Any]], finish_reason: str | None, usage: dict[str, Any] | None,
                  status: str | None = None) -> dict[str, Any]:
        """The Response object: its output items, status and usage, and the request's settings."""
        if status is None:
            status = "incomplete" if finish_reason == "length" else "completed"
        choices = self.chat.choices
        reasoning_tokens = choices[0].num_reasoning_tokens if choices else 0
        return {
            "id": self.response_id, "object": "response", "created_at": self.created, "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.chat.parsed.model, "output": [_copy(item) for item in items],
            **self.request.echo, "previous_response_id": None, "reasoning": {"effort": None, "summary": None},
            "store": False, "truncation": "disabled",
            "usage": None if usage is None else {
                "input_tokens": usage["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]},
                "output_tokens": usage["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                "total_tokens": usage["total_tokens"]},
        }
