"""The built-in chat template: Qwen3's ChatML, in plain Python.

Used by tokenizers whose directory has no chat template of its own (and by the built-in
vocabulary), in the tokenizer process: a chat becomes ChatML there and nowhere else. It renders
what the Qwen3 checkpoints' jinja template renders:

- each system/user turn is `<|im_start|>{role}\\n{content}<|im_end|>\\n`;
- an assistant turn's reasoning is its `reasoning_content` when given (clients send it apart from
  the answer), else what its content holds before `</think>`;
- assistant turns before the last user query lose their reasoning (and, when it came inside the
  content, the newlines after it); those after it, in a tool loop, keep it as
  `<think>\\n{reasoning}\\n</think>\\n\\n`;
- consecutive tool results become one user turn of `<tool_response>` blocks;
- with tools, the system turn (the client's system message, if it comes first, then two newlines)
  lists them as JSON lines inside `<tools>` and says how to call them; an assistant turn's function
  calls follow its answer as `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` blocks
  (a newline between blocks, and before the first when the answer is not empty);
- the generation prompt is `<|im_start|>assistant\\n`, followed by an empty think block
  `<think>\\n\\n</think>\\n\\n` when thinking is disabled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ROLES = ("system", "user", "assistant", "tool")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_END_OF_TURN = "<|im_end|>\n"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_TOOLS_INTRO = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_TOOLS_OUTRO = ("\n</tools>\n\nFor each function call, return a json object with function name and "
                "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n')


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    reasoning_content: str | None = None  # an assistant's reasoning, when given apart from content
    tool_calls: tuple[tuple[str, str], ...] = ()  # an assistant's function calls: (name, arguments JSON)


def normalize_content(content: object, index: int, role: object = None) -> str:
    """A message's content as one string: a string, or a list of {"type": "text"} parts joined by \\n."""
    if isinstance(content, str):
        return content
    if content is None and role == "assistant":
        return ""  # OpenAI clients send content null on assistant turns that only called tools
    if not isinstance(content, list):
        raise ValueError(
            f"messages[{index}].content must be a string or a list of text parts, "
            f"got {type(content).__name__}"
        )
    texts = []
    for part_index, part in enumerate(content):
        where = f"messages[{index}].content[{part_index}]"
        if not isinstance(part, Mapping):
            raise ValueError(f"{where} must be an object with type 'text', got {type(part).__name__}")
        if part.get("type") != "text":
            raise ValueError(f"{where}.type is {part.get('type')!r}; only 'text' parts are supported")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{where}.text must be a string, got {type(part.get('text')).__name__}")
        texts.append(part["text"])
    return "\n".join(texts)


def flatten_contents(messages: Sequence[Mapping]) -> list[dict]:
    """The messages with every content flattened to a string, other fields untouched.

    For a model's own jinja template, which may know roles and fields (tool_calls) that the
    built-in one does not, but typically renders list content as nothing.
    """
    flat = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{index}] must be an object, got {type(message).__name__}")
        content = normalize_content(message.get("content"), index, message.get("role"))
        flat.append({**message, "content": content})
    return flat


def parse_messages(messages: Sequence[Mapping]) -> list[ChatMessage]:
    """Validate request messages into ChatMessages; errors name the message index and field."""
    parsed = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{index}] must be an object, got {type(message).__name__}")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(
                f"messages[{index}] has unknown role {role!r}; expected one of {', '.join(ROLES)}"
            )
        tool_calls = _parse_tool_calls(message.get("tool_calls"), index)
        reasoning = message.get("reasoning_content")
        if reasoning is not None and not isinstance(reasoning, str):
            raise ValueError(
                f"messages[{index}].reasoning_content must be a string, got {type(reasoning).__name__}"
            )
        content = normalize_content(message.get("content"), index, role)
        parsed.append(ChatMessage(role, content, reasoning, tool_calls))
    return parsed


def _parse_tool_calls(calls: object, index: int) -> tuple[tuple[str, str], ...]:
    """(name, arguments as JSON text) of each call, given as OpenAI's {"type": "function",
    "function": {"name", "arguments"}} or as {"name", "arguments"}; arguments a string or an object."""
    if not calls:
        return ()
    if not isinstance(calls, Sequence) or isinstance(calls, str):
        raise ValueError(f"messages[{index}].tool_calls must be a list, got {type(calls).__name__}")
    parsed = []
    for number, call in enumerate(calls):
        where = f"messages[{index}].tool_calls[{number}]"
        function = call.get("function", call) if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(f"{where} must be an object with function.name a string")
        arguments = function.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = to_json(arguments)
        parsed.append((function["name"], arguments))
    return tuple(parsed)


def to_json(value: object) -> str:
    """JSON text as the chat template's `tojson` writes it: non-ASCII kept, ", " and ": " separators."""
    return json.dumps(value, ensure_ascii=False)


def _last_query_index(messages: Sequence[ChatMessage]) -> int:
    """The last user turn that is a real query, not tool results pasted back as a user turn."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        is_tool_result = message.content.startswith(TOOL_RESPONSE_OPEN) and message.content.endswith(
            TOOL_RESPONSE_CLOSE
        )
        if message.role == "user" and not is_tool_result:
            return index
    return len(messages) - 1


def split_reasoning(message: ChatMessage) -> tuple[str, str]:
    """(reasoning, answer) of an assistant turn, the way Qwen3's template splits them."""
    if message.reasoning_content is not None:
        return message.reasoning_content, message.content
    if THINK_CLOSE not in message.content:
        return "", message.content
    pieces = message.content.split(THINK_CLOSE)
    reasoning = pieces[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
    return reasoning, pieces[-1].lstrip("\n")


def _render_assistant(message: ChatMessage, keep_reasoning: bool, is_last: bool) -> str:
    reasoning, answer = split_reasoning(message)
    if keep_reasoning and (is_last or reasoning):
        reasoning = reasoning.strip("\n")
        body = f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n" + _reply(message, answer, answer.lstrip("\n"))
    else:
        body = _reply(message, answer, answer)
    return f"<|im_start|>assistant\n{body}{_END_OF_TURN}"


def _reply(message: ChatMessage, answer: str, shown: str) -> str:
    """An assistant turn's answer as shown, then its function calls."""
    calls = [f'{TOOL_CALL_OPEN}\n{{"name": "{name}", "arguments": {arguments}}}\n{TOOL_CALL_CLOSE}'
             for name, arguments in message.tool_calls]
    return shown + ("\n" if answer else "") + "\n".join(calls) if calls else shown


def continued_reply(message: ChatMessage) -> str:
    """What a final assistant message left open (`continue_final_message`) has written of the reply,
    after its reasoning block: the text the model goes on from, which a structured output's grammar
    must read first."""
    answer = split_reasoning(message)[1]
    return _reply(message, answer, answer.lstrip("\n"))


def _render_tools(tools: Sequence[Mapping], chat: Sequence[ChatMessage]) -> str:
    system = f"{chat[0].content}\n\n" if chat and chat[0].role == "system" else ""
    listed = "".join(f"\n{to_json(tool)}" for tool in tools)
    return f"<|im_start|>system\n{system}{_TOOLS_INTRO}{listed}{_TOOLS_OUTRO}"


def _render_tool(messages: Sequence[ChatMessage], index: int) -> str:
    starts_group = index == 0 or messages[index - 1].role != "tool"
    ends_group = index == len(messages) - 1 or messages[index + 1].role != "tool"
    return (
        ("<|im_start|>user" if starts_group else "")
        + f"\n{TOOL_RESPONSE_OPEN}\n{messages[index].content}\n{TOOL_RESPONSE_CLOSE}"
        + ("<|im_end|>\n" if ends_group else "")
    )


def render_chatml(
    messages: Sequence[Mapping],
    add_generation_prompt: bool = True,
    enable_thinking: bool = True,
    tools: Sequence[Mapping] | None = None,
    continue_final_message: bool = False,
) -> str:
    """The Qwen3 prompt text for a chat, with the functions in `tools` offered to the model (see the
    module docstring for the format). `continue_final_message`: the last message, an assistant's, is
    left open (no end of turn) for the model to continue; it excludes `add_generation_prompt`."""
    chat = parse_messages(messages)
    if continue_final_message:
        if add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        if not chat or chat[-1].role != "assistant":
            raise ValueError("continue_final_message needs the last message to be the assistant's")
        return render_chatml(messages, False, enable_thinking, tools).removesuffix(_END_OF_TURN)
    last_query = _last_query_index(chat)
    parts = [_render_tools(tools, chat)] if tools else []
    for index, message in enumerate(chat):
        if tools and index == 0 and message.role == "system":
            continue  # inside the tools' system turn
        if message.role == "assistant":
            is_last = index == len(chat) - 1
            parts.append(_render_assistant(message, keep_reasoning=index > last_query, is_last=is_last))
        elif message.role == "tool":
            parts.append(_render_tool(chat, index))
        else:
            parts.append(f"<|im_start|>{message.role}\n{message.content}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
        if not enable_thinking:
            parts.append(f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n")
    return "".join(parts)
