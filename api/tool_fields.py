"""The function-calling fields of a chat completion request: `tools`, `tool_choice`,
`parallel_tool_calls`, checked.

`tools` is OpenAI's list of {"type": "function", "function": {"name", "description", "parameters"}};
the tokenizer process's chat template offers them to the model as written (Qwen3's template lists
each as one JSON line), and the reply's `<tool_call>` blocks come back as `tool_calls`
(api/tool_call_parser.py). `tool_choice`:

* "auto" (the default when tools are given): the model decides; its calls are parsed out;
* "none": the tools are not offered and nothing is parsed, as if none were given;
* "required": the reply is one or more calls of the offered tools, and a named function
  ({"type": "function", "function": {"name": ...}}): calls of that one. Both are enforced by
  constrained decoding (api/structured_fields.py): the model can write nothing else. With
  `parallel_tool_calls` false, one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.body_fields import BodyFields, describe
from api.errors import invalid

MAX_TOOLS = 128


@dataclass(frozen=True)
class ToolSettings:
    tools: list[dict[str, Any]] | None  # offered to the model; None: no tools in the prompt
    parallel: bool  # parallel_tool_calls: False keeps the reply's first call only
    forced: str | None = None  # tool_choice "required" or the forced function's name; None: the model decides

    @property
    def parse_calls(self) -> bool:
        return self.tools is not None


def parse_tool_fields(fields: BodyFields) -> ToolSettings:
    """The request's tool settings, or ApiError naming the first bad field."""
    tools = _parse_tools(fields.get("tools"))
    choice = fields.get("tool_choice")
    forced = None
    if choice is not None and choice not in ("auto", "none"):
        function = choice.get("function") if isinstance(choice, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if choice != "required" and not isinstance(name, str):
            raise invalid("tool_choice", f"'tool_choice' must be 'auto', 'none', 'required' or "
                          f"{{'type': 'function', 'function': {{'name': ...}}}}; got {describe(choice)}")
        forced = "required" if choice == "required" else name
        if not tools:
            raise invalid("tool_choice",
                          f"tool_choice {forced!r} forces a call, but the request offers no tools")
        if forced != "required" and all(tool["function"]["name"] != forced for tool in tools):
            raise invalid("tool_choice", f"tool_choice names the function {forced!r}, which is not among "
                          f"the tools: {', '.join(tool['function']['name'] for tool in tools)}")
    parallel = fields.bool("parallel_tool_calls", True)
    if choice == "none" or not tools:
        return ToolSettings(None, parallel)
    return ToolSettings(tools, parallel, forced)


def _parse_tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise invalid("tools", f"'tools' must be an array of tools, got {describe(value)}")
    if len(value) > MAX_TOOLS:
        raise invalid("tools", f"at most {MAX_TOOLS} tools per request; got {len(value)}")
    names = set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else describe(tool)
            raise invalid(f"{where}.type", f"'{where}' must be a function tool {{'type': 'function', "
                          f"'function': {{...}}}}; got type {kind!r}")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise invalid(f"{where}.function",
                          f"'{where}.function' must be an object, got {describe(function)}")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise invalid(f"{where}.function.name", f"'{where}.function.name' must be a non-empty string")
        if name in names:
            raise invalid(f"{where}.function.name", f"two tools are named {name!r}")
        names.add(name)
        for field, kind in (("description", str), ("parameters", dict)):
            if function.get(field) is not None and not isinstance(function[field], kind):
                raise invalid(f"{where}.function.{field}", f"'{where}.function.{field}' must be "
                              f"{'a string' if kind is str else 'an object (a JSON Schema)'}")
    return value
