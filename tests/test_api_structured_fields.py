"""The request fields that constrain an output's form (api/structured_fields.py): what spec each
becomes, and the 400 that names the field when it cannot be served."""

from __future__ import annotations

import json

import pytest

from api.errors import ApiError
from api.protocol import ServedModel, parse_chat_request, parse_completion_request
from core.generation_defaults import QWEN3_GENERATION_DEFAULTS
from core.structured.grammar import compile_spec

MODEL = ServedModel("qwen3-tiny", 4096, QWEN3_GENERATION_DEFAULTS)
SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
          "required": ["a"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time"}}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def chat_spec(**fields) -> dict | None:
    body = {"messages": [{"role": "user", "content": "q"}], **fields}
    spec = parse_chat_request(body, MODEL, "r").requests[0].params.structured_output
    return json.loads(spec) if spec else None


def completion_spec(**fields) -> dict | None:
    parsed = parse_completion_request({"prompt": "q", **fields}, MODEL, "r")
    spec = parsed.requests[0].params.structured_output
    return json.loads(spec) if spec else None


def refusal(parse, **fields) -> ApiError:
    chat = parse is parse_chat_request
    body = {"messages": [{"role": "user", "content": "q"}]} if chat else {"prompt": "q"}
    with pytest.raises(ApiError) as info:
        parse({**body, **fields}, MODEL, "r")
    assert info.value.status == 400
    return info.value


def test_response_format_json_schema_keeps_the_schema_and_its_key_order():
    spec = chat_spec(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
                     **NO_THINKING)
    assert spec == {"type": "json_schema", "schema": SCHEMA}
    assert list(spec["schema"]["properties"]) == ["b", "a"]


def test_a_chat_with_thinking_on_lets_the_reasoning_come_first():
    assert chat_spec(response_format={"type": "json_object"}) == {"type": "json_object", "reasoning": True}
    assert chat_spec(response_format={"type": "json_object"}, **NO_THINKING) == {"type": "json_object"}
    assert completion_spec(response_format={"type": "json_object"}) == {"type": "json_object"}


def test_text_and_nothing_leave_the_output_free():
    assert chat_spec(response_format={"type": "text"}) is None and chat_spec() is None
    assert completion_spec() is None


def test_vllm_guided_fields_and_structured_outputs():
    assert completion_spec(guided_json=json.dumps(SCHEMA)) == {"type": "json_schema", "schema": SCHEMA}
    assert completion_spec(guided_choice=["yes", "no"]) == {"type": "choice", "choices": ["yes", "no"]}
    assert completion_spec(structured_outputs={"choice": ["a"]}) == {"type": "choice", "choices": ["a"]}
    assert completion_spec(structured_outputs={"json": SCHEMA}) == {"type": "json_schema", "schema": SCHEMA}
    assert completion_spec(guided_regex="[0-9]+") == {"type": "regex", "pattern": "[0-9]+"}
    assert completion_spec(structured_outputs={"regex": "a|b"}) == {"type": "regex", "pattern": "a|b"}
    assert completion_spec(structured_outputs={"json_object": True}) == {"type": "json_object"}
    sql = 'root ::= "SELECT " column\ncolumn ::= "col_1" | "col_2"'
    assert completion_spec(guided_grammar=sql) == {"type": "grammar", "grammar": sql}
    assert completion_spec(structured_outputs={"grammar": sql}) == {"type": "grammar", "grammar": sql}
    lark = 'start: "SELECT " column\ncolumn: "col_1" | "col_2"'  # vLLM's other grammar form
    assert completion_spec(guided_grammar=lark) == {"type": "grammar", "grammar": lark}
    # SGLang's names for the same constraints
    assert completion_spec(ebnf=sql) == {"type": "grammar", "grammar": sql}
    assert completion_spec(regex="a|b") == {"type": "regex", "pattern": "a|b"}
    assert completion_spec(json_schema=json.dumps(SCHEMA)) == {"type": "json_schema", "schema": SCHEMA}
    assert completion_spec(structured_outputs={"json_object": False}) is None
    assert completion_spec(structured_outputs={"json": SCHEMA, "disable_any_whitespace": True}) == {
        "type": "json_schema", "schema": SCHEMA, "compact": True}


def test_disable_any_whitespace_leaves_no_room_between_json_tokens():
    spec = completion_spec(structured_outputs={"json_object": True, "disable_any_whitespace": True})
    automaton = compile_spec(json.dumps(spec)).automaton
    initial = compile_spec(json.dumps(spec)).initial
    assert automaton.can_end(automaton.advance_bytes(initial, b'{"a":[1,"x y"],"b":{}}'))
    for spaced in (b'{ "a":1}', b'{"a": 1}', b'{"a":1 }', b'{"a":[1, 2]}', b'\n{}'):
        assert not automaton.advance_bytes(initial, spaced), spaced
    loose = compile_spec(json.dumps({"type": "json_object"}))
    assert loose.automaton.can_end(loose.automaton.advance_bytes(loose.initial, b'{"a": [1, 2]}'))


def test_disable_additional_properties_closes_objects_that_do_not_say_otherwise():
    schema = {"type": "object", "properties": {"meta": {"type": "object"},
                                               "tags": {"type": "object", "additionalProperties": True}}}
    spec = completion_spec(structured_outputs={"json": schema, "disable_additional_properties": True})
    assert spec == {"type": "json_schema", "schema": schema, "closed_objects": True}
    closed = compile_spec(json.dumps(spec))
    opened = compile_spec(json.dumps({"type": "json_schema", "schema": schema}))
    filled = b'{"meta": {"x": 1}'
    empty = b'{"meta": {}, "tags": {"y": 2}}'
    assert not closed.automaton.advance_bytes(closed.initial, filled)  # meta names no properties
    assert opened.automaton.advance_bytes(opened.initial, filled)
    # tags says additionalProperties true: it stays open
    assert closed.automaton.can_end(closed.automaton.advance_bytes(closed.initial, empty))
    json_mode = completion_spec(structured_outputs={"json_object": True,
                                                    "disable_additional_properties": True})
    mode = compile_spec(json.dumps(json_mode))
    assert mode.automaton.advance_bytes(mode.initial, b'{"any": 1')  # JSON mode's objects stay open


def test_a_forced_tool_choice_becomes_tool_call_blocks():
    required = chat_spec(tools=[WEATHER, CLOCK], tool_choice="required", **NO_THINKING)
    assert required["type"] == "tool_calls"
    assert [t["name"] for t in required["tools"]] == ["get_weather", "get_time"]
    assert required["max_calls"] > 1
    named = chat_spec(tools=[WEATHER, CLOCK], parallel_tool_calls=False, **NO_THINKING,
                      tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert named == {"type": "tool_calls", "tools": [{"name": "get_time", "parameters": None}],
                     "max_calls": 1}
    assert chat_spec(tools=[WEATHER], tool_choice="auto") is None


@pytest.mark.parametrize("fields, param, words", [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"schema": {"type": "string", "pattern": "(?=a)b"}}}},
     "response_format", "lookaround"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"schema": {"type": "string", "format": "x", "multipleOf": 2}}}},
     "response_format", "'multipleOf' is not supported"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "needs 'json_schema'"),
    ({"response_format": "json"}, "response_format", "must be an object"),
    ({"response_format": {"type": "grammar"}}, "response_format", "'text', 'json_object' or 'json_schema'"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_json": [1]}, "guided_json", "JSON schema"),
    ({"guided_choice": []}, "guided_choice", "non-empty array"),
    ({"guided_regex": "a(b"}, "guided_regex", "without its ')'"),
    ({"guided_regex": ""}, "guided_regex", "non-empty string"),
    ({"guided_grammar": "root ::= x"}, "guided_grammar", "rule 'root' uses rule 'x', which is never defined"),
    ({"guided_grammar": ""}, "guided_grammar", "non-empty string (a GBNF or lark grammar"),
    ({"structured_outputs": {"grammar": 'expr ::= expr "+" "1" | "1"\nroot ::= expr'}},
     "structured_outputs.grammar", "rule 'expr' is left-recursive"),
    ({"structured_outputs": {"grammar": 'root ::= "a" ('}}, "structured_outputs.grammar",
     "a group '(' without its ')' (grammar line 1, column 15)"),
    ({"structured_outputs": {"lark": "start: x"}}, "structured_outputs", "structured_outputs.lark"),
    ({"guided_regex": "a", "regex": "b"}, "regex", "'guided_regex' and 'regex' both constrain"),
    ({"ebnf": "root ::= x"}, "ebnf", "'ebnf' cannot be enforced: grammar: rule 'root' uses rule 'x'"),
    ({"guided_grammar": 'start: "a"\n%ignore " "'}, "guided_grammar", "'%ignore' is not supported"),
    ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs", "must be a boolean"),
    ({"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": 1}}, "structured_outputs",
     "disable_any_whitespace must be a boolean"),
    ({"structured_outputs": {"json": SCHEMA, "disable_additional_properties": "no"}}, "structured_outputs",
     "disable_additional_properties must be a boolean"),
    ({"structured_outputs": {"json_object": True, "regex": "a"}}, "structured_outputs.regex",
     "both constrain"),
    ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "guided_choice", "both constrain"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice", "both constrain"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "number", "multipleOf": 3.5}}}}}],
      "tool_choice": "required"},
     "tool_choice", "multipleOf"),
])
def test_what_cannot_be_served_is_refused_naming_the_field(fields, param, words):
    error = refusal(parse_chat_request, **fields)
    assert error.param == param and words in error.message, error.message


def test_a_schema_nested_too_deep_is_refused_before_it_is_compiled():
    deep: dict = {"type": "string"}
    for _ in range(40):
        deep = {"type": "array", "items": {"anyOf": [deep]}}
    error = refusal(parse_chat_request,
                    response_format={"type": "json_schema", "json_schema": {"schema": deep}})
    assert error.param == "response_format.json_schema.schema" and "nested more than 64" in error.message
    tool = {"type": "function", "function": {"name": "f", "parameters": deep}}
    assert "nested" in refusal(parse_chat_request, tools=[tool], tool_choice="required").message


def test_a_guided_choice_that_is_not_a_list_is_refused_on_completions():
    error = refusal(parse_completion_request, guided_choice="yes")
    assert error.param == "guided_choice"


def test_a_continued_final_message_is_the_beginning_the_form_must_allow():
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": '{"a": "x', "reasoning_content": "thought"}]
    body = {"messages": messages, "continue_final_message": True, "add_generation_prompt": False,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}
    spec = json.loads(parse_chat_request(body, MODEL, "r").requests[0].params.structured_output)
    # the reasoning block is closed in the prompt already: no `<think>` may come first
    assert spec == {"type": "json_schema", "schema": SCHEMA, "written": '{"a": "x'}
    grammar = compile_spec(json.dumps(spec))
    ended = grammar.automaton.advance_bytes(grammar.initial, b'"}')  # the string closes, the object ends
    assert ended and grammar.automaton.can_end(ended)
    assert not grammar.automaton.advance_bytes(grammar.initial, b'"]')
    with pytest.raises(ApiError) as info:
        parse_chat_request({**body, "messages": [messages[0], {"role": "assistant", "content": "Sure! "}]},
                           MODEL, "r")
    assert info.value.status == 400 and info.value.param == "messages"
    assert "continue_final_message" in info.value.message and "'Sure! '" in info.value.message
    # without a form, a continued message is free text as before
    free = parse_chat_request({**body, "response_format": None}, MODEL, "r")
    assert not free.requests[0].params.structured_output
