"""The fields of a request that constrain its output's form, turned into one structured-output spec.

OpenAI's `response_format` (`text`; `json_object`: any JSON object; `json_schema`: a value its
`json_schema.schema` accepts), a forced `tool_choice` ("required": one or more calls of the offered
tools; a named function: calls of that one; with `parallel_tool_calls` false at most one call) and
vLLM's `guided_json` / `guided_choice` / `guided_regex` / `guided_grammar` (GBNF or lark, the forms
vLLM's grammars take: core/structured/ebnf.py; SGLang's `json_schema` / `regex` / `ebnf` name the
same) and vLLM's newer `structured_outputs.json` / `.choice` /
`.regex` / `.grammar` / `.json_object` (`.disable_any_whitespace`: no whitespace between JSON tokens;
`.disable_additional_properties`: an object schema without additionalProperties takes no other keys)
all become a spec of core/structured/specs.py that SamplingParams carries to the sampler, which
masks every token the output's grammar does not allow next (core/structured/token_masks.py). In a chat
with thinking on, the output may begin with a `<think>` block, the form applying after it; a chat
whose final assistant message is continued (`continue_final_message`) has its reply begun already,
so the form applies from that message's answer on (a 400 where the form cannot begin so).

A request gives at most one of them. Schemas, patterns and grammars that cannot be enforced are
refused with a 400 naming the field and what in it, never served unconstrained.
"""

from __future__ import annotations

from typing import Any

import orjson

from api.body_fields import BodyFields, describe
from api.errors import invalid
from api.tool_fields import MAX_TOOLS, ToolSettings
from core.structured.grammar import GrammarError, compile_spec
from core.structured.specs import (
    choice_spec,
    closed_objects_spec,
    compact_spec,
    continued_spec,
    grammar_spec,
    json_object_spec,
    json_schema_spec,
    regex_spec,
    tool_calls_spec,
)

MAX_SCHEMA_DEPTH = 64  # nesting of objects and arrays in a schema's JSON
# SGLang's names for the same constraints (its OpenAI-compatible requests' `json_schema`, `regex`
# and `ebnf`), by the guided kind they are.
SGLANG_FIELDS = {"json": "json_schema", "regex": "regex", "grammar": "ebnf"}
STRUCTURED_FIELDS = frozenset({"response_format", "guided_json", "guided_choice", "guided_regex",
                               "guided_grammar", "structured_outputs", *SGLANG_FIELDS.values()})


def parse_structured_output(fields: BodyFields, reasoning: bool, tools: ToolSettings | None = None,
                            written: str = "") -> str:
    """The spec the request's output must follow, "" for free text; ApiError names a bad field.
    `written`: the reply's text so far (a final assistant message continued), which the output's
    form must allow as its beginning."""
    specs: list[tuple[str, str]] = []  # (field, spec)
    response_format = fields.get("response_format")
    if response_format is not None:
        spec = _response_format(response_format, reasoning)
        if spec:
            specs.append(("response_format", spec))
    guided = {"json": fields.get("guided_json"), "choice": fields.get("guided_choice"),
              "regex": fields.get("guided_regex"), "grammar": fields.get("guided_grammar")}
    outputs = fields.get("structured_outputs")
    compact = closed = False
    if outputs is not None:
        if not isinstance(outputs, dict):
            raise invalid("structured_outputs",
                          f"'structured_outputs' must be an object, got {describe(outputs)}")
        known = (*guided, "json_object", "disable_any_whitespace", "disable_additional_properties")
        unknown = sorted(k for k, v in outputs.items() if v is not None and k not in known)
        if unknown:
            raise invalid("structured_outputs", f"structured_outputs.{unknown[0]} is not supported: this "
                          "server constrains outputs to JSON schemas ('json', 'json_object'), choices "
                          "('choice'), regular expressions ('regex') and grammars ('grammar'), with "
                          "or without whitespace "
                          "between JSON tokens ('disable_any_whitespace') and additional properties "
                          "('disable_additional_properties')")
        for flag in ("json_object", "disable_any_whitespace", "disable_additional_properties"):
            if outputs.get(flag) is not None and not isinstance(outputs[flag], bool):
                raise invalid("structured_outputs", f"structured_outputs.{flag} must be a boolean, got "
                              f"{describe(outputs[flag])}")
        compact = bool(outputs.get("disable_any_whitespace"))
        closed = bool(outputs.get("disable_additional_properties"))
        if outputs.get("json_object"):
            specs.append(("structured_outputs.json_object", json_object_spec(reasoning)))
        guided = {k: outputs.get(k) if outputs.get(k) is not None else v for k, v in guided.items()}
        names = {k: f"structured_outputs.{k}" for k in guided}
    else:
        names = {k: f"guided_{k}" for k in guided}
    for kind, name in SGLANG_FIELDS.items():
        if fields.get(name) is None:
            continue
        if guided[kind] is not None:
            raise invalid(name, f"'{names[kind]}' and '{name}' both constrain the output; give one")
        guided[kind], names[kind] = fields.get(name), name
    if guided["json"] is not None:
        specs.append((names["json"], json_schema_spec(_schema(guided["json"], names["json"]), reasoning)))
    if guided["choice"] is not None:
        choices = guided["choice"]
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise invalid(names["choice"], f"'{names['choice']}' must be a non-empty array of non-empty "
                          f"strings, got {describe(choices)}")
        specs.append((names["choice"], choice_spec(choices, reasoning)))
    if guided["regex"] is not None:
        if not isinstance(guided["regex"], str) or not guided["regex"]:
            raise invalid(names["regex"], f"'{names['regex']}' must be a non-empty string (a regular "
                          f"expression), got {describe(guided['regex'])}")
        specs.append((names["regex"], regex_spec(guided["regex"], reasoning)))
    if guided["grammar"] is not None:
        if not isinstance(guided["grammar"], str) or not guided["grammar"].strip():
            raise invalid(names["grammar"], f"'{names['grammar']}' must be a non-empty string (a GBNF or "
                          f"lark grammar), got {describe(guided['grammar'])}")
        specs.append((names["grammar"], grammar_spec(guided["grammar"], reasoning)))
    if tools is not None and tools.forced is not None:
        specs.append(("tool_choice", _tool_spec(tools, reasoning)))
    if len(specs) > 1:
        raise invalid(specs[1][0], f"'{specs[0][0]}' and '{specs[1][0]}' both constrain the output; give one")
    if not specs:
        return ""
    field, spec = specs[0]
    if compact:
        spec = compact_spec(spec)
    if closed:
        spec = closed_objects_spec(spec)
    try:
        compile_spec(spec)
    except GrammarError as e:
        raise invalid(field, f"'{field}' cannot be enforced: {e}") from None
    if written:
        spec = continued_spec(spec, written)
        try:
            compile_spec(spec)
        except GrammarError as e:
            raise invalid("messages", f"continue_final_message with '{field}': {e}") from None
    return spec


def _response_format(value: Any, reasoning: bool) -> str:
    if not isinstance(value, dict):
        raise invalid("response_format", f"'response_format' must be an object, got {describe(value)}")
    kind = value.get("type")
    if kind == "text":
        return ""
    if kind == "json_object":
        return json_object_spec(reasoning)
    if kind == "json_schema":
        described = value.get("json_schema")
        if not isinstance(described, dict):
            raise invalid("response_format", "response_format json_schema needs 'json_schema': "
                          "{'name': ..., 'schema': {...}}")
        schema = described.get("schema", {})
        return json_schema_spec(_schema(schema, "response_format.json_schema.schema"), reasoning)
    raise invalid("response_format", f"response_format type must be 'text', 'json_object' or "
                  f"'json_schema', got {describe(kind)}")


def _schema(value: Any, field: str) -> dict[str, Any]:
    """A JSON schema given as an object or as its JSON text."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as e:
            raise invalid(field, f"'{field}' is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise invalid(field, f"'{field}' must be a JSON schema (an object), got {describe(value)}")
    _check_depth(value, field)
    return value


def _check_depth(schema: Any, field: str) -> None:
    """Refuse a schema nested past MAX_SCHEMA_DEPTH (it would only recurse its way to an error)."""
    level = [schema]
    for _ in range(MAX_SCHEMA_DEPTH + 1):
        level = [child for node in level for child in (
            node.values() if isinstance(node, dict) else node if isinstance(node, list) else ())
            if isinstance(child, dict | list)]
        if not level:
            return
    raise invalid(field, f"'{field}' is nested more than {MAX_SCHEMA_DEPTH} levels deep")


def _tool_spec(tools: ToolSettings, reasoning: bool) -> str:
    offered = [tool["function"] for tool in tools.tools or ()]
    for function in offered:
        _check_depth(function.get("parameters"), "tools")
    if tools.forced != "required":
        offered = [function for function in offered if function["name"] == tools.forced]
    return tool_calls_spec(offered, max_calls=MAX_TOOLS if tools.parallel else 1, reasoning=reasoning)
