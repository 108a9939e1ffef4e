"""ToolCallParser: the function calls in a Qwen3 chat reply, taken out of its content as they stream.

Qwen3 calls a function by writing, in its answer (after any reasoning), a block

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

(the Hermes format that its chat template teaches; `<tool_call>` and `</tool_call>` are tokens of
their own, kept by skip_special_tokens). The chat endpoint feeds each choice's content deltas to
one parser, after the reasoning splitter (api/reasoning.py), and sends what comes out: the text
around the blocks as `content`, each block, once complete, as one entry of `tool_calls` with an
id of its own and the arguments as JSON text. Streamed and whole replies go through the same
parser, so a streamed reply adds up to the whole one.

What it does with the text:
* text before the first block is content, as written;
* once a call is made, text that is only whitespace (the newlines between and after blocks) is
  dropped; any other text is content;
* a block whose body is not a JSON object with a string `name` stays in the content as written,
  tags included, and so does a block the reply ends inside (max_tokens): nothing the model wrote is
  lost;
* with `parallel` off (the request's parallel_tool_calls false), calls after the first are dropped.
Text that might still turn out to be `<tool_call>` (`<tool_c`) is held back until the next delta
decides it, or until `finish()`.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, NamedTuple

from api.reasoning import partial_suffix

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


class Parsed(NamedTuple):
    content: str
    tool_calls: list[dict[str, Any]]  # OpenAI's form, with their index among the reply's calls


class ToolCallParser:
    def __init__(self, parallel: bool = True) -> None:
        self._parallel = parallel
        self._held = ""  # text not yet known to be content, or the body of an open block
        self._in_call = False
        self._searched = 0  # in a block: how much of _held is known to hold no closing tag
        self.num_calls = 0

    def feed(self, text: str) -> Parsed:
        self._held += text
        content: list[str] = []
        calls: list[dict[str, Any]] = []
        while True:
            if self._in_call:
                end = self._held.find(TOOL_CALL_CLOSE, self._searched)
                if end < 0:  # a long block streams in token by token: search only what is new
                    self._searched = max(0, len(self._held) - len(TOOL_CALL_CLOSE) + 1)
                    return Parsed("".join(content), calls)
                body, self._held = self._held[:end], self._held[end + len(TOOL_CALL_CLOSE):]
                self._in_call = False
                self._take_call(body, content, calls)
                continue
            start = self._held.find(TOOL_CALL_OPEN)
            if start >= 0:
                self._emit(self._held[:start], content)
                self._held = self._held[start + len(TOOL_CALL_OPEN):]
                self._in_call, self._searched = True, 0
                continue
            keep = partial_suffix(self._held, TOOL_CALL_OPEN)
            if self.num_calls and not self._held[:len(self._held) - keep].strip():
                return Parsed("".join(content), calls)  # whitespace after a call: wait and see
            self._emit(self._held[:len(self._held) - keep], content)
            self._held = self._held[len(self._held) - keep:]
            return Parsed("".join(content), calls)

    def finish(self) -> Parsed:
        """Whatever is held back, once the reply has ended."""
        held, self._held = self._held, ""
        if self._in_call:
            self._in_call = False
            return Parsed(TOOL_CALL_OPEN + held, [])
        if self.num_calls and not held.strip():
            return Parsed("", [])
        return Parsed(held, [])

    def _emit(self, text: str, content: list[str]) -> None:
        if text and not (self.num_calls and not text.strip()):
            content.append(text)

    def _take_call(self, body: str, content: list[str], calls: list[dict[str, Any]]) -> None:
        call = _parse_call(body)
        if call is None:
            content.append(f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}")
            return
        if self.num_calls and not self._parallel:
            return
        name, arguments = call
        calls.append({"index": self.num_calls, "id": f"call_{secrets.token_hex(12)}", "type": "function",
                      "function": {"name": name, "arguments": arguments}})
        self.num_calls += 1


def _parse_call(body: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a block's body, or None if it is not a call."""
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return call["name"], arguments

