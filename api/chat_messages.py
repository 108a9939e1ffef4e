"""The `messages` of a chat completion request and its chat-template arguments, checked.

Roles are OpenAI's (system, developer, user, assistant, tool: Qwen3's template knows no developer,
so a developer message is rendered as a system one, which is how OpenAI treats it); content is a
string or an array of text parts (joined with newlines); an assistant turn's `reasoning_content`
(or `reasoning`, vLLM's name) and `tool_calls` (OpenAI's {"id", "type": "function", "function":
{"name", "arguments"}}, arguments as JSON text) travel as fields of their own of the ChatTurn, for
the tokenizer process's chat template. Non-text parts are refused, naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from api.body_fields import BodyFields, describe, joined_text
from api.errors import invalid
from core.tokenizer.chat_template import continued_reply
from core.tokenizer.chat_template import parse_messages as parse_template_messages
from ipc.messages import ChatTurn, ToolCallTurn
from procs.prompt_checks import template_message

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
_MESSAGE_FIELDS = frozenset({"role", "content", "name", "reasoning", "reasoning_content", "tool_call_id",
                             "tool_calls"})


def parse_messages(value: Any) -> list[ChatTurn]:
    """The chat turns of `messages`, or ApiError naming the first bad field."""
    if not isinstance(value, list) or not value:
        raise invalid("messages", f"'messages' must be a non-empty array of messages, got {describe(value)}")
    turns = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(where, f"'{where}' must be an object, got {describe(message)}")
        unknown = sorted(set(message) - _MESSAGE_FIELDS)
        if unknown:
            raise invalid(f"{where}.{unknown[0]}", f"unrecognized message field '{where}.{unknown[0]}'")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise invalid(f"{where}.role", f"'{where}.role' must be one of {', '.join(CHAT_ROLES)}; got "
                          f"{describe(role)}")
        tool_calls = _tool_calls(message.get("tool_calls"), where, role)
        content = _message_content(message.get("content"), where, role)
        reasoning = _reasoning(message, where, role)
        for name in ("name", "tool_call_id"):
            if message.get(name) is not None and not isinstance(message[name], str):
                raise invalid(f"{where}.{name}", f"'{where}.{name}' must be a string")
        turns.append(ChatTurn(role=role, content=content, reasoning_content=reasoning, tool_calls=tool_calls))
    return turns


def _reasoning(message: dict[str, Any], where: str, role: str) -> str | None:
    """An assistant turn's reasoning, under either name (`reasoning`, vLLM's; `reasoning_content`)."""
    given = {name: message[name] for name in ("reasoning", "reasoning_content")
             if message.get(name) is not None}
    for name, value in given.items():
        if role != "assistant" or not isinstance(value, str):
            raise invalid(f"{where}.{name}", f"'{where}.{name}' must be a string on an assistant message")
    if len(set(given.values())) > 1:
        raise invalid(f"{where}.reasoning", f"'{where}.reasoning' and '{where}.reasoning_content' differ; "
                      "they are two names of one field: give one")
    return next(iter(given.values()), None)


def _tool_calls(value: Any, where: str, role: str) -> list[ToolCallTurn] | None:
    if not value:
        return None
    if role != "assistant" or not isinstance(value, list):
        raise invalid(f"{where}.tool_calls",
                      f"'{where}.tool_calls' must be an array, on an assistant message")
    calls = []
    for j, call in enumerate(value):
        call_where = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise invalid(f"{call_where}.function", f"'{call_where}' must be {{'type': 'function', "
                          "'function': {'name': ..., 'arguments': ...}}")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)  # as the template's tojson would
        if not isinstance(arguments, str):
            raise invalid(f"{call_where}.function.arguments",
                          f"'{call_where}.function.arguments' must be a string of JSON")
        calls.append(ToolCallTurn(function["name"], arguments))
    return calls


def _message_content(content: Any, where: str, role: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        if role == "assistant":
            return ""
        raise invalid(f"{where}.content", f"'{where}.content' is required on a {role} message")
    return joined_text(content, f"{where}.content", ("text",), "text part")


def parse_template_kwargs(fields: BodyFields) -> bool:
    """`chat_template_kwargs.enable_thinking` (the Qwen3 template's only argument); True when left out."""
    kwargs = fields.get("chat_template_kwargs")
    if kwargs is None:
        return True
    if not isinstance(kwargs, dict):
        raise invalid("chat_template_kwargs",
                      f"'chat_template_kwargs' must be an object, got {describe(kwargs)}")
    unknown = sorted(set(kwargs) - {"enable_thinking"})
    if unknown:
        raise invalid(f"chat_template_kwargs.{unknown[0]}",
                      f"unknown chat template argument {unknown[0]!r}; the Qwen3 template takes "
                      "enable_thinking")
    enable = kwargs.get("enable_thinking", True)
    if not isinstance(enable, bool):
        raise invalid("chat_template_kwargs.enable_thinking",
                      f"'chat_template_kwargs.enable_thinking' must be a boolean, got {describe(enable)}")
    return enable


def parse_continue_final_message(fields: BodyFields, turns: list[ChatTurn],
                                 add_generation_prompt: bool) -> bool:
    """vLLM's `continue_final_message`: the chat's last message, an assistant's, left open for the model
    to continue (a prefilled answer); it needs add_generation_prompt false."""
    if not fields.bool("continue_final_message", False):
        return False
    if add_generation_prompt:
        raise invalid("continue_final_message", "continue_final_message and add_generation_prompt cannot "
                      "both be true; set add_generation_prompt to false to continue the last message")
    if turns[-1].role != "assistant":
        raise invalid("messages", f"continue_final_message needs the last message to be the assistant's, "
                      f"got role {turns[-1].role!r}")
    return True


def continued_answer(turn: ChatTurn) -> str:
    """What a final assistant turn left open has written of the reply, as the chat template shows it
    (its answer after the reasoning block, then its calls)."""
    return continued_reply(parse_template_messages([template_message(turn)])[0])
