"""Structured outputs, the byte level: which texts a compiled spec accepts (core/structured/grammar.py
and automaton.py), and which specs are refused with the keyword named."""

from __future__ import annotations

import json

import pytest

from core.structured.grammar import GrammarError, compile_spec
from core.structured.specs import choice_spec, json_object_spec, json_schema_spec, tool_calls_spec

PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}},
}, "required": ["name", "age"]}


def verdict(spec: str, text: str | bytes) -> str:
    """"complete", "prefix" (valid so far, not done) or "rejected"."""
    grammar = compile_spec(spec)
    state = grammar.automaton.advance_bytes(grammar.initial, text.encode() if isinstance(text, str) else text)
    if not state:
        return "rejected"
    return "complete" if grammar.automaton.can_end(state) else "prefix"


@pytest.mark.parametrize("text, expected", [
    ('{"name": "Ann", "age": 31}', "complete"),
    ('{"name":"Ann","age":31,"tags":["a","b"]}', "complete"),
    ('{\n  "name": "Ann",\n  "age": -0,\n  "tags": []\n}', "complete"),
    ('{"name": "Ann", "age": 31', "prefix"),
    ('{"name": "Ann", "age": 3', "prefix"),
    ('{"age": 31, "name": "Ann"}', "rejected"),  # properties come in the schema's order
    ('{"name": "Ann"}', "rejected"),  # age is required
    ('{"name": "Ann", "age": 3.5}', "rejected"),  # an integer
    ('{"name": "Ann", "age": 012}', "rejected"),  # no leading zeros
    ('{"name": "Ann", "age": 1, "extra": 1}', "rejected"),  # no keys outside the properties
    ('{"name": "Ann", "age": 1,}', "rejected"),  # no trailing comma
    ('{"name": "Ann", "age": 1}{', "rejected"),  # nothing after the value
    ('{"name": "Ann", "age": 1} ', "rejected"),
    ('{"name": 5, "age": 1}', "rejected"),
])
def test_an_object_schema_takes_its_properties_in_order_and_nothing_else(text, expected):
    assert verdict(json_schema_spec(PERSON), text) == expected


@pytest.mark.parametrize("text, expected", [
    ('"plain"', "complete"),
    ('"tab\\tquote\\"slash\\\\u\\u00e9"', "complete"),
    ('"caf\u00e9 \u4e2d\u6587 \U0001f600"', "complete"),
    ('"bad \\x escape"', "rejected"),
    ('"\\u00g0"', "rejected"),
    ('"raw\nnewline"', "rejected"),  # control bytes must be escaped
    (b'"\xc3"', "rejected"),  # a UTF-8 character cut short
    (b'"\xff"', "rejected"),
    (b'"\x80"', "rejected"),  # a continuation byte without a lead
])
def test_strings_take_escapes_and_whole_utf8_characters_only(text, expected):
    assert verdict(json_schema_spec({"type": "string"}), text) == expected


def test_strings_take_exactly_the_utf8_that_decodes():
    """Every lead byte with every first continuation byte: the string takes the pair where some
    character begins so (no overlong forms, no surrogates, nothing above U+10FFFF), and each such
    beginning can be finished; whole characters at the range edges are taken or refused as
    Python's decoder does."""
    grammar = compile_spec(json_schema_spec({"type": "string"}))
    automaton = grammar.automaton
    opened = automaton.advance_bytes(grammar.initial, b'"')
    for lead in range(0xC0, 0x100):
        need = 2 if lead <= 0xDF else 3 if lead <= 0xEF else 4
        for second in range(0x80, 0xC0):
            head = bytes((lead, second))
            valid = any(_decodes(head + b"\x80" * (need - 3) + bytes((last,)))
                        for last in (0x80, 0xBF)) if need > 2 else _decodes(head)
            state = automaton.advance_bytes(opened, head)
            assert bool(state) == valid, head.hex()
            if valid and need > 2:
                assert automaton.advance_bytes(state, b"\x80" * (need - 2) + b'"'), head.hex()
    for char in (b"\xe0\xa0\x80", b"\xed\x9f\xbf", b"\xee\x80\x80", b"\xf0\x90\x80\x80",
                 b"\xf4\x8f\xbf\xbf", b"\xe0\x9f\xbf", b"\xed\xa0\x80", b"\xf0\x8f\xbf\xbf",
                 b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xc1\xbf", b"\xf5\x80\x80\x80"):
        assert (verdict(json_schema_spec({"type": "string"}), b'"' + char + b'"') == "complete") \
            == _decodes(char), char.hex()


def _decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_string_lengths_count_characters_and_escapes_once():
    spec = json_schema_spec({"type": "string", "minLength": 2, "maxLength": 3})
    assert verdict(spec, '"ab"') == "complete"
    assert verdict(spec, '"\u00e9\u00e9\u00e9"') == "complete"  # 3 characters, 6 bytes
    assert verdict(spec, '"a\\n"') == "complete"
    assert verdict(spec, '"a"') == "rejected"
    assert verdict(spec, '"abcd') == "rejected"


@pytest.mark.parametrize("text, expected", [
    ("0", "complete"), ("-12.5e+3", "complete"), ("1E9", "complete"), ("3.", "prefix"), ("-", "prefix"),
    ("1e", "prefix"), (".5", "rejected"), ("01", "rejected"), ("1.2.3", "rejected"), ("+1", "rejected"),
])
def test_numbers_follow_json(text, expected):
    assert verdict(json_schema_spec({"type": "number"}), text) == expected


def test_arrays_keep_within_min_and_max_items():
    spec = json_schema_spec({"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2})
    assert verdict(spec, "[true]") == "complete"
    assert verdict(spec, "[true, false]") == "complete"
    assert verdict(spec, "[]") == "rejected"
    assert verdict(spec, "[true, false, true]") == "rejected"


def test_enum_const_and_any_of_take_exactly_their_values():
    spec = json_schema_spec({"anyOf": [{"enum": ["red", 1, None]}, {"const": {"a": [1, 2]}},
                                       {"type": "integer"}]})
    for text in ('"red"', "1", "12", "null", '{"a": [1, 2]}'):
        assert verdict(spec, text) == "complete", text
    for text in ('"blue"', '{"a": [1,2]}', "true", "1.5"):
        assert verdict(spec, text) == "rejected", text


def test_recursive_refs_nest():
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["value"]}}, "$ref": "#/$defs/node"}
    spec = json_schema_spec(tree)
    assert verdict(spec, '{"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}]}') == "complete"
    assert verdict(spec, '{"value": 1, "children": [{"children": []}]}') == "rejected"


def test_optional_properties_may_be_skipped_but_not_reordered():
    integer = {"type": "integer"}
    spec = json_schema_spec({"type": "object", "properties": {"a": integer, "b": integer, "c": integer},
                             "required": ["c"]})
    for text in ('{"c": 1}', '{"a": 1, "c": 1}', '{"b": 1, "c": 1}', '{"a": 1, "b": 2, "c": 3}'):
        assert verdict(spec, text) == "complete", text
    assert verdict(spec, '{"c": 1, "a": 1}') == "rejected"
    assert verdict(spec, "{}") == "rejected"


def test_json_mode_takes_any_object_and_only_an_object():
    spec = json_object_spec()
    assert verdict(spec, '{"a": [1, {"b": null}], "c": "d"}') == "complete"
    assert verdict(spec, "{}") == "complete"
    for text in ("[1]", '"s"', "1"):
        assert verdict(spec, text) == "rejected"


def test_whitespace_is_one_space_or_a_newline_and_an_indent():
    spec = json_object_spec()
    assert verdict(spec, '{\n\t"a": 1 }') == "complete"
    assert verdict(spec, '{  "a": 1}') == "rejected"  # two spaces
    assert verdict(spec, '{\n\n"a": 1}') == "rejected"  # two newlines
    assert verdict(spec, "{\n" + " " * 21 + '"a": 1}') == "rejected"  # an indent past 20


def test_a_reasoning_block_may_come_first():
    spec = json_object_spec(reasoning=True)
    assert verdict(spec, "<think>\nI < think {not json} </thin </think>\n\n{}") == "complete"
    assert verdict(spec, "{}") == "complete"
    assert verdict(spec, "<think>never closed {}") == "prefix"
    assert verdict(json_object_spec(), "<think></think>{}") == "rejected"


def test_choice_is_one_of_the_strings_as_text():
    spec = choice_spec(["yes", "yes, sir", "no"])
    assert [verdict(spec, t) for t in ("yes", "yes, sir", "no", "ye", "nope")] == [
        "complete", "complete", "complete", "prefix", "rejected"]


def test_tool_calls_are_qwen3_blocks_naming_an_offered_tool():
    weather = {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    clock = {"name": "get_time", "parameters": None}
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    other = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    one = tool_calls_spec([weather, clock], max_calls=1)
    two = tool_calls_spec([weather, clock], max_calls=2)
    assert verdict(one, call) == "complete" and verdict(one, other) == "complete"
    assert verdict(one, call + "\n" + other) == "rejected"
    assert verdict(two, call + "\n" + other) == "complete"
    assert verdict(one, call.replace("get_weather", "get_wind")) == "rejected"
    assert verdict(one, call.replace('"city"', '"town"')) == "rejected"
    assert verdict(one, "") == "prefix"  # a call is required


@pytest.mark.parametrize("schema, words", [
    ({"type": "string", "pattern": "^(a)\\1$"}, ["pattern", "\\1 is not supported"]),
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, ["pattern with minLength or maxLength"]),
    ({"type": "string", "pattern": '^"quoted"$'}, ["unescaped in a JSON string"]),
    ({"type": "number", "multipleOf": 2}, ["'multipleOf'", "schema"]),
    ({"type": "object", "properties": {"n": {"type": "number", "minimum": 2.5e-30}}},
     ["minimum 2.5e-30", "properties.n", "fraction digits"]),
    ({"$ref": "http://example.com/s.json"}, ["$ref", "local"]),
    ({"$ref": "#/$defs/missing"}, ["missing"]),
    ({"type": "decimal"}, ["'decimal'"]),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, ["'b'"]),
    ({"type": "array", "minItems": 3, "maxItems": 2}, ["minItems 3"]),
    ({"type": "string", "maxLength": -1}, ["maxLength"]),
    ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, ["allOf"]),
])
def test_what_cannot_be_enforced_is_refused_with_the_keyword_named(schema, words):
    with pytest.raises(GrammarError) as info:
        compile_spec(json_schema_spec(schema))
    assert all(word in str(info.value) for word in words), str(info.value)


def test_annotations_and_unenforced_formats_are_accepted():
    schema = {"title": "T", "description": "d", "type": "object", "$schema": "x",
              "properties": {"where": {"type": "string", "format": "hostname", "default": "here"}}}
    assert verdict(json_schema_spec(schema), '{"where": "2026"}') == "complete"


def test_bad_specs_are_refused():
    for spec, word in (("not json", "not JSON"), ('{"type": "lark"}', "unknown structured-output type"),
                       ('{"type": "grammar"}', "grammar needs the grammar's text"),
                       ('{"type": "regex"}', "non-empty string"),
                       (json.dumps({"type": "tool_calls", "tools": []}), "non-empty"),
                       (json.dumps({"type": "choice", "choices": [""]}), "non-empty")):
        with pytest.raises(GrammarError, match=word):
            compile_spec(spec)


def test_deep_or_huge_schemas_are_refused_not_crashed_on():
    deep = '{"type": "array", "items": ' * 3000 + '{"type": "string"}' + "}" * 3000
    with pytest.raises(GrammarError, match="nested too deeply"):
        compile_spec('{"type": "json_schema", "schema": ' + deep + "}")
    with pytest.raises(GrammarError, match="at most 1000"):
        compile_spec(json_schema_spec({"enum": list(range(1001))}))
    wide = {"anyOf": [{"enum": [i]} for i in range(25_000)]}
    with pytest.raises(GrammarError, match="more than 20000 nodes"):
        compile_spec(json_schema_spec(wide))


def test_alternatives_that_share_a_prefix_keep_a_bounded_state():
    # 2^12 ways to be an object of twelve booleans-or-nulls that look alike until a value comes
    branch = {"anyOf": [{"type": "object", "properties": {"k": {"type": "boolean"}}, "required": ["k"]},
                        {"type": "object", "properties": {"k": {"type": "null"}}, "required": ["k"]}]}
    nested: dict = branch
    for _ in range(12):
        nested = {"anyOf": [{"type": "array", "items": nested, "maxItems": 1},
                            {"type": "array", "items": branch, "maxItems": 1}]}
    grammar = compile_spec(json_schema_spec(nested))
    state = grammar.automaton.advance_bytes(grammar.initial, b"[" * 12)
    assert 0 < len(state) <= 64
    # every stack kept is a way to a valid end: close what is open, innermost first
    for stack in state:
        assert grammar.automaton.can_end(grammar.automaton.advance_bytes(
            frozenset([stack]), b'{"k": null}' + b"]" * 12)) or grammar.automaton.can_end(
            grammar.automaton.advance_bytes(frozenset([stack]), b'{"k": true}' + b"]" * 12))
