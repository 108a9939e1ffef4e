"""The soak's judge of replies from /v1/responses (OpenAI's Responses API) and /v1/messages
(Anthropic's Messages API), whole and streamed: each must be the API's object or its event sequence
in the API's order, end as the API says a reply ends, and count its output tokens.

    responses  a `response` object, status completed (or incomplete: max_output_tokens); a stream
               numbers its events from 0 (`sequence_number`), starts with response.created and ends
               with response.completed or response.incomplete, nothing after;
    messages   a `message` object, stop_reason end_turn, max_tokens or stop_sequence; a stream starts
               with message_start and ends message_delta (the stop reason), message_stop.
"""

from __future__ import annotations

from typing import Any

import orjson

from benchmarks.soak.verdict import Verdict
from benchmarks.soak.workload import RESPONSES, Shot

_ENDS = {"completed": None, "incomplete": "max_output_tokens"}  # a response's status: its reason
_STOP_REASONS = ("end_turn", "max_tokens", "stop_sequence")


async def judge(response: Any, shot: Shot) -> int:
    """The reply's output tokens once it passes every check; Verdict on the first that fails."""
    if not shot.stream:
        body = await response.json(loads=orjson.loads)
        return _whole_response(body) if shot.path == RESPONSES else _whole_message(body)
    events = []
    async for raw in response.content:
        line = raw.strip()
        if line.startswith(b"data:"):
            event = orjson.loads(line[5:].strip())
            if event.get("type") == "error":
                raise Verdict(f"error event: {event.get('error') or event}")
            events.append(event)
    if not events:
        raise Verdict("the stream ended without an event")
    return _response_events(events) if shot.path == RESPONSES else _message_events(events)


def _whole_response(body: dict[str, Any]) -> int:
    if body.get("object") != "response":
        raise Verdict(f"object {body.get('object')!r}, expected 'response'")
    status = body.get("status")
    if status not in _ENDS:
        raise Verdict(f"status {status!r}, expected completed or incomplete ({body.get('error')})")
    reason = (body.get("incomplete_details") or {}).get("reason")
    if reason != _ENDS[status]:
        raise Verdict(f"status {status} with incomplete_details.reason {reason!r}")
    if not body.get("output"):  # a message, or reasoning cut by max_output_tokens
        raise Verdict("no output items")
    return body["usage"]["output_tokens"]


def _response_events(events: list[dict[str, Any]]) -> int:
    numbers = [event.get("sequence_number") for event in events]
    if numbers != list(range(len(events))):
        raise Verdict(f"sequence numbers {numbers[:8]}..., expected 0, 1, 2, ...")
    kinds = [event.get("type") for event in events]
    if kinds[0] != "response.created":
        raise Verdict(f"the first event is {kinds[0]!r}, expected response.created")
    if kinds[-1] not in ("response.completed", "response.incomplete"):
        raise Verdict(f"the last event is {kinds[-1]!r}, expected response.completed or response.incomplete")
    ends = [k for k in kinds if k in ("response.completed", "response.incomplete", "response.failed")]
    if len(ends) != 1:
        raise Verdict(f"{len(ends)} final events: {ends}")
    return _whole_response(events[-1]["response"])


def _whole_message(body: dict[str, Any]) -> int:
    if body.get("type") != "message" or body.get("role") != "assistant":
        raise Verdict(f"type {body.get('type')!r} role {body.get('role')!r}, expected an assistant message")
    if body.get("stop_reason") not in _STOP_REASONS:
        raise Verdict(f"stop_reason {body.get('stop_reason')!r}, expected one of {_STOP_REASONS}")
    if (body["stop_reason"] == "stop_sequence") != (body.get("stop_sequence") is not None):
        raise Verdict(f"stop_reason {body['stop_reason']} with stop_sequence {body.get('stop_sequence')!r}")
    return body["usage"]["output_tokens"]


def _message_events(events: list[dict[str, Any]]) -> int:
    kinds = [event.get("type") for event in events]
    if kinds[0] != "message_start" or kinds[-2:] != ["message_delta", "message_stop"]:
        raise Verdict(f"events {kinds[:2]} ... {kinds[-2:]}, expected message_start ... message_delta, "
                      "message_stop")
    if kinds.count("message_start") != 1 or kinds.count("message_stop") != 1:
        raise Verdict(f"{kinds.count('message_start')} message_start, {kinds.count('message_stop')} "
                      "message_stop")
    opened = [e["index"] for e in events if e.get("type") == "content_block_start"]
    closed = [e["index"] for e in events if e.get("type") == "content_block_stop"]
    if opened != closed or opened != list(range(len(opened))):
        raise Verdict(f"content blocks opened {opened}, closed {closed}")
    delta = events[-2]
    stop = delta["delta"].get("stop_reason")
    if stop not in _STOP_REASONS:
        raise Verdict(f"stop_reason {stop!r}, expected one of {_STOP_REASONS}")
    return delta["usage"]["output_tokens"]
