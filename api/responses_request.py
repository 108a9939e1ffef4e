"""A POST /v1/responses body (OpenAI's Responses API), checked and turned into the chat completion
request it asks for: /v1/responses is served by the chat endpoint's code (api/responses_call.py
renders its replies as Responses objects and events).

What is taken:
* `input`: a string (one user message) or a list of items: messages (`role` system, developer,
  user or assistant; `content` a string or `input_text` / `output_text` parts), `function_call`
  items (the assistant's earlier calls), `function_call_output` items (their results, as tool
  messages) and `reasoning` items (their `reasoning_text`, kept on the next assistant turn);
* `instructions`, as a system message before the input;
* `max_output_tokens`, `temperature`, `top_p`, `parallel_tool_calls`, `stream`;
* `tools` (function tools, in the Responses form `{"type": "function", "name", "parameters"}`),
  `tool_choice` (`auto`, `none`, `required` or `{"type": "function", "name"}`), `text.format`
  (`text`, `json_object` or `json_schema`), all enforced as on /v1/chat/completions;
* vLLM's extra sampling fields (`top_k`, `min_p`, `seed`, `repetition_penalty`, `stop`,
  `chat_template_kwargs`, ...), passed on to the chat parser, which checks them.
Accepted and ignored: `store` (nothing is stored: every request carries its whole conversation),
`metadata`, `user`, `include`, `reasoning`, `service_tier`, `prompt_cache_key`,
`safety_identifier`, `stream_options`. Refused with a 400 naming the field: what needs stored
state (`previous_response_id`, `conversation`, `background`, item references), built-in tools,
non-text input, `truncation` "auto", `top_logprobs`, and the chat endpoint's own names for
things this API names otherwise (`messages`, `max_tokens`, `response_format`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.body_fields import describe, joined_text
from api.errors import invalid

# Responses fields with nothing to do here (nothing is stored, nothing is billed or traced).
_IGNORED = frozenset({"store", "metadata", "user", "include", "reasoning", "service_tier", "prompt_cache_key",
                      "safety_identifier", "stream_options"})
# Fields that need state this server does not keep.
_STATEFUL = {"previous_response_id": "send the whole conversation in 'input' instead",
             "conversation": "send the whole conversation in 'input' instead",
             "prompt": "prompt templates are not stored here; send 'instructions' and 'input'"}
# The chat endpoint's names, where this API has its own.
_CHAT_NAMES = {"messages": "input", "max_tokens": "max_output_tokens",
               "max_completion_tokens": "max_output_tokens", "response_format": "text.format",
               "n": None, "logprobs": None, "functions": "tools", "function_call": "tool_choice"}
# Fields of this API's own, translated below.
_TRANSLATED = frozenset({"input", "instructions", "max_output_tokens", "text", "tools", "tool_choice",
                         "truncation", "top_logprobs", "background"})
_TEXT_PARTS = ("input_text", "output_text", "text")  # the first is what an error names
_ROLES = frozenset({"system", "developer", "user", "assistant"})


@dataclass(frozen=True)
class ResponsesRequest:
    chat_body: dict[str, Any]  # the chat completion request it is served as
    echo: dict[str, Any]  # the request's settings, as the Response object repeats them


def parse_responses_body(body: Any) -> ResponsesRequest:
    """The chat body a Responses body asks for, or ApiError naming the first bad field."""
    if not isinstance(body, dict):
        raise invalid(None, f"the request body must be a JSON object, got {describe(body)}")
    for name, instead in _CHAT_NAMES.items():
        if name in body:
            hint = f"; /v1/responses takes '{instead}'" if instead else " and not of /v1/responses"
            raise invalid(name, f"'{name}' is a field of /v1/chat/completions{hint}")
    for name, instead in _STATEFUL.items():
        if body.get(name) is not None:
            raise invalid(name, f"'{name}' is not supported: this server stores no responses; {instead}")
    if body.get("background"):
        raise invalid("background", "'background' responses are not supported: this server stores none")
    if body.get("truncation", "disabled") not in ("disabled", None):
        raise invalid("truncation", f"'truncation' must be \"disabled\", got {describe(body['truncation'])}: "
                      "a conversation over the context length is refused, not cut")
    if body.get("top_logprobs"):
        raise invalid("top_logprobs", "'top_logprobs' is not supported on /v1/responses; "
                      "/v1/chat/completions has logprobs")
    passed = {k: v for k, v in body.items() if k not in _IGNORED and k not in _TRANSLATED}
    messages = _input_messages(body.get("input"))
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("instructions", f"'instructions' must be a string, got {describe(instructions)}")
        messages.insert(0, {"role": "system", "content": instructions})
    chat: dict[str, Any] = {**passed, "messages": messages}
    max_output_tokens = body.get("max_output_tokens")
    if max_output_tokens is not None:
        if type(max_output_tokens) is not int or max_output_tokens < 1:
            raise invalid("max_output_tokens", "'max_output_tokens' must be an integer >= 1, got "
                          f"{describe(max_output_tokens)}")
        chat["max_completion_tokens"] = max_output_tokens
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    text_format = _text_format(body.get("text"))
    if text_format is not None:
        chat["response_format"] = text_format
    if body.get("stream") is True:
        chat["stream_options"] = {"include_usage": True}  # the final event carries the usage
    echo = {"instructions": instructions, "max_output_tokens": max_output_tokens,
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "text": body.get("text") or {"format": {"type": "text"}},
            "metadata": body.get("metadata") or {}, "user": body.get("user")}
    return ResponsesRequest(chat, echo)


def _input_messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        if not value:
            raise invalid("input", "'input' must not be empty")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise invalid("input", "'input' must be a string or a non-empty array of items, got "
                      f"{describe(value)}")
    messages: list[dict[str, Any]] = []
    reasoning: list[str] = []  # reasoning items' text, for the next assistant turn
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, f"'{where}' must be an object, got {describe(item)}")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise invalid(f"{where}.role", f"'{where}.role' must be one of {', '.join(sorted(_ROLES))}; "
                              f"got {describe(role)}")
            message = {"role": role, "content": _text(item.get("content"), f"{where}.content")}
            if role == "assistant" and reasoning:
                message["reasoning_content"] = "".join(reasoning)
                reasoning.clear()
            messages.append(message)
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where),
                                 "arguments": _string(item, "arguments", where)}}
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant" or reasoning:
                last = {"role": "assistant", "content": None}
                if reasoning:
                    last["reasoning_content"] = "".join(reasoning)
                    reasoning.clear()
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                             "content": content})
        elif kind == "reasoning":
            parts = item.get("content") or []
            if not isinstance(parts, list):
                raise invalid(f"{where}.content",
                              f"'{where}.content' must be an array of reasoning_text parts")
            reasoning += [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        elif kind == "item_reference":
            raise invalid(where, f"'{where}' refers to a stored item; this server stores none: send the item")
        else:
            raise invalid(f"{where}.type", f"'{where}.type' must be message, function_call, "
                          f"function_call_output or reasoning; got {describe(kind)}")
    if not messages:
        raise invalid("input", "'input' has no message")
    return messages


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or text parts joined with newlines."""
    return joined_text(content, where, _TEXT_PARTS, "text part")


def _string(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise invalid(f"{where}.{name}", f"'{where}.{name}' must be a string, got {describe(value)}")
    return value


def _tools(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise invalid("tools", f"'tools' must be an array of tools, got {describe(value)}")
    tools = []
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise invalid(f"tools[{i}].type", f"'tools[{i}]' must be a function tool {{'type': 'function', "
                          f"'name': ...}}; got type {kind!r} (built-in tools are not supported)")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") == "function":
        return {"type": "function", "function": {"name": value.get("name")}}
    if value in ("auto", "none", "required"):
        return value
    raise invalid("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                  f"{{'type': 'function', 'name': ...}}, got {describe(value)}")


def _text_format(text: Any) -> dict[str, Any] | None:
    """`text.format` as the chat endpoint's response_format (None: free text)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise invalid("text", f"'text' must be an object, got {describe(text)}")
    form = text.get("format")
    if form is None:
        return None
    kind = form.get("type") if isinstance(form, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: form[k] for k in ("name", "schema", "strict", "description") if k in form}
        return {"type": "json_schema", "json_schema": schema}
    raise invalid("text.format", "'text.format.type' must be text, json_object or json_schema, got "
                  f"{describe(kind)}")
