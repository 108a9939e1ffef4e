"""A POST /v1/messages body (Anthropic's Messages API), checked and turned into the chat completion
request it asks for: /v1/messages is served by the chat endpoint's code (api/anthropic_call.py
renders its replies as Anthropic messages and events). Clients built for that API (Claude Code, the
`anthropic` SDK) can then talk to a Qwen3 checkpoint.

What is taken:
* `messages` (`user` / `assistant`; content a string or blocks: `text`; an assistant's `tool_use`
  (its calls) and `thinking` (its reasoning, for the chat template); a user's `tool_result` (as tool
  messages, before the turn's text)); `system` (a string or text blocks) as the system message;
* `max_tokens` (required, as there), `stop_sequences`, `temperature`, `top_p`, `top_k`, `stream`;
* `tools` (`{"name", "description", "input_schema"}`) and `tool_choice` (`auto`, `any` (a call is
  required), `tool` (that one), `none`; `disable_parallel_tool_use`), enforced as on chat;
* `thinking`: Qwen3's thinking switch (`disabled` off; `enabled`, `adaptive`, `between_tools` on;
  left out: the model's default, on);
* `output_config.format` (a JSON schema), enforced as a chat's `response_format`;
* vLLM's extra sampling fields (`min_p`, `seed`, `repetition_penalty`, `presence_penalty`,
  `frequency_penalty`, `ignore_eos`, `min_tokens`), checked by the chat parser as there (load
  tools ask for a fixed output length with `ignore_eos`).
Other fields (`metadata`, `cache_control`, `output_config.effort`, ... the API grows) are ignored;
the chat endpoint's names (`n`, `response_format`, ...) get a 400, as do images, documents and
server tools, naming the field or block.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from api.body_fields import describe, joined_text
from api.errors import invalid

_PASSED = ("model", "temperature", "top_p", "top_k", "stream", "min_p", "seed", "repetition_penalty",
           "presence_penalty", "frequency_penalty", "ignore_eos", "min_tokens")
# The chat endpoint's own names, which a client of this API would not send on purpose.
_CHAT_NAMES = frozenset({"n", "max_completion_tokens", "response_format", "stop", "tool_calls", "functions"})
# The thinking settings that turn Qwen3's thinking on ("adaptive": the model decides; Qwen3 does).
_THINKING_ON = ("enabled", "adaptive", "between_tools")


@dataclass(frozen=True)
class MessagesRequest:
    chat_body: dict[str, Any]  # the chat completion request it is served as
    stop_sequences: tuple[str, ...]  # to tell a stop sequence from the end of the turn


def parse_messages_body(body: Any) -> MessagesRequest:
    """The chat body a Messages body asks for, or ApiError naming the first bad field."""
    if not isinstance(body, dict):
        raise invalid(None, f"the request body must be a JSON object, got {describe(body)}")
    confused = sorted(set(body) & _CHAT_NAMES)
    if confused:
        raise invalid(confused[0], f"'{confused[0]}' is not a field of /v1/messages (it is one of "
                      "/v1/chat/completions)")
    max_tokens = body.get("max_tokens")
    if type(max_tokens) is not int or max_tokens < 1:
        raise invalid("max_tokens", f"'max_tokens' is required, an integer >= 1; got {describe(max_tokens)}")
    chat: dict[str, Any] = {k: body[k] for k in _PASSED if k in body}
    chat["max_tokens"] = max_tokens
    chat["messages"] = [*_system(body.get("system")), *_messages(body.get("messages"))]
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid("stop_sequences", "'stop_sequences' must be an array of non-empty strings, got "
                      f"{describe(body.get('stop_sequences'))}")
    if stops:
        chat["stop"] = stops
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat.update(_tool_choice(body["tool_choice"]))
    thinking = body.get("thinking")
    if thinking is not None:
        if not isinstance(thinking, dict):
            raise invalid("thinking", "'thinking' must be an object {'type': ...}, got "
                          f"{describe(thinking)}")
        kind = thinking.get("type")
        if kind not in (*_THINKING_ON, "disabled"):
            raise invalid("thinking", f"'thinking.type' must be one of {', '.join(_THINKING_ON)}, disabled; "
                          f"got {describe(kind)}")
        chat["chat_template_kwargs"] = {"enable_thinking": kind != "disabled"}
    form = (body.get("output_config") or {}).get("format") if isinstance(body.get("output_config"), dict) \
        else None
    if form is not None:
        if not isinstance(form, dict) or form.get("type") != "json_schema" or "schema" not in form:
            raise invalid("output_config.format", "'output_config.format' must be {'type': 'json_schema', "
                          f"'schema': ...}}, got {describe(form)}")
        chat["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "output", "schema": form["schema"]}}
    if body.get("stream") is True:
        chat["stream_options"] = {"include_usage": True}  # message_delta carries the output tokens
    return MessagesRequest(chat, tuple(stops))


def _system(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "system", "content": value}] if value else []
    return [{"role": "system", "content": _text_blocks(value, "system")}]


def _text_blocks(value: Any, where: str) -> str:
    return joined_text(value, where, ("text",), "text block")


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise invalid("messages", f"'messages' must be a non-empty array of messages, got {describe(value)}")
    messages = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise invalid(f"{where}.role", f"'{where}.role' must be user or assistant, got {describe(role)}")
        content = message.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
        elif role == "user":
            messages += _user_blocks(content, f"{where}.content")
        else:
            messages.append(_assistant_blocks(content, f"{where}.content"))
    return messages


def _blocks(content: Any, where: str) -> list[tuple[str, dict[str, Any], str]]:
    """(type, block, where) of each block of a content array."""
    if not isinstance(content, list):
        raise invalid(where, f"'{where}' must be a string or an array of content blocks, got "
                      f"{describe(content)}")
    blocks = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        blocks.append((kind, block, f"{where}[{j}]"))
    return blocks


def _user_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """A user turn's tool results (tool messages, first) and its text (one user message)."""
    results, texts = [], []
    for kind, block, at in _blocks(content, where):
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise invalid(f"{at}.tool_use_id", f"'{at}.tool_use_id' must be a string")
            output = block.get("content", "")
            text = _text_blocks(output, f"{at}.content")
            if block.get("is_error"):
                text = f"Error: {text}"
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        else:
            raise invalid(at, f"'{at}' must be a text or tool_result block; got type {kind!r} "
                          "(images and documents are not supported)")
    return [*results, *([{"role": "user", "content": "\n".join(texts)}] if texts else [])]


def _assistant_blocks(content: Any, where: str) -> dict[str, Any]:
    """An assistant turn: its text, its reasoning (thinking blocks) and its calls (tool_use blocks)."""
    texts, reasoning, calls = [], [], []
    for kind, block, at in _blocks(content, where):
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # another model's sealed reasoning: nothing to render
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise invalid(at, f"'{at}' must have a string id and name")
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": arguments}})
        else:
            raise invalid(at, f"'{at}' must be a text, thinking or tool_use block; got type {kind!r}")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise invalid("tools", f"'tools' must be an array of tools, got {describe(value)}")
    tools = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or "input_schema" not in tool:
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise invalid(f"tools[{i}]", f"'tools[{i}]' must be a client tool {{'name': ..., 'input_schema': "
                          f"...}}; got {describe(tool) if kind is None else f'type {kind!r}'} (server tools "
                          "are not supported)")
        function = {"name": tool["name"], "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(value: Any) -> dict[str, Any]:
    kind = value.get("type") if isinstance(value, dict) else None
    choices = {"auto": "auto", "any": "required", "none": "none"}
    if kind in choices:
        choice: Any = choices[kind]
    elif kind == "tool" and isinstance(value.get("name"), str):
        choice = {"type": "function", "function": {"name": value["name"]}}
    else:
        raise invalid("tool_choice", "'tool_choice' must be {'type': 'auto' | 'any' | 'none'} or {'type': "
                      f"'tool', 'name': ...}}, got {describe(value)}")
    chat: dict[str, Any] = {"tool_choice": choice}
    if value.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False
    return chat
