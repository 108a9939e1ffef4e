"""The structured-output specs that SamplingParams.structured_output carries, built from their parts.

The API builds them from `response_format`, `tool_choice` and vLLM's guided fields (json, choice,
regex, grammar); a native client
(api.client) passes one of these to SamplingParams itself. core/structured/grammar.py says what each
means. A spec keeps its schema's key order: properties are generated in that order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def _spec(**fields: Any) -> str:
    return json.dumps({name: value for name, value in fields.items() if value is not None},
                      ensure_ascii=False, separators=(",", ":"))


def json_object_spec(reasoning: bool = False) -> str:
    """Any JSON object (OpenAI's JSON mode)."""
    return _spec(type="json_object", reasoning=reasoning or None)


def json_schema_spec(schema: dict[str, Any], reasoning: bool = False) -> str:
    """A JSON value the schema accepts."""
    return _spec(type="json_schema", schema=schema, reasoning=reasoning or None)


def choice_spec(choices: Sequence[str], reasoning: bool = False) -> str:
    """Exactly one of `choices`, as plain text (vLLM's guided_choice)."""
    return _spec(type="choice", choices=list(choices), reasoning=reasoning or None)


def regex_spec(pattern: str, reasoning: bool = False) -> str:
    """Plain text that `pattern` matches whole (vLLM's guided_regex; core/structured/regex.py)."""
    return _spec(type="regex", pattern=pattern, reasoning=reasoning or None)


def grammar_spec(grammar: str, reasoning: bool = False) -> str:
    """Plain text a GBNF grammar derives from its `root` rule (vLLM's guided_grammar;
    core/structured/ebnf.py)."""
    return _spec(type="grammar", grammar=grammar, reasoning=reasoning or None)


def tool_calls_spec(tools: Sequence[dict[str, Any]], max_calls: int = 1, reasoning: bool = False) -> str:
    """1..max_calls Qwen3 tool-call blocks; `tools` as {"name": ..., "parameters": {...}}."""
    return _spec(type="tool_calls", tools=[{"name": t["name"], "parameters": t.get("parameters")}
                                           for t in tools], max_calls=max_calls, reasoning=reasoning or None)


def continued_spec(spec: str, written: str) -> str:
    """`spec` for a reply that already begins with `written` (a final assistant message the model
    continues): the grammar reads it before the first generated token."""
    return _spec(**json.loads(spec), written=written or None)


def compact_spec(spec: str) -> str:
    """`spec` with no whitespace between JSON tokens (vLLM's `disable_any_whitespace`)."""
    return _spec(**json.loads(spec), compact=True)


def closed_objects_spec(spec: str) -> str:
    """`spec` whose object schemas take no keys beyond their properties unless additionalProperties
    says otherwise (vLLM's `disable_additional_properties`)."""
    return _spec(**json.loads(spec), closed_objects=True)
