"""Integer bounds in JSON schemas (minimum, maximum, exclusiveMinimum, exclusiveMaximum): the
pattern of a range against Python's own comparison, the bounds' reading, and the grammar's verdicts."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from benchmarks.lib.schema_check import conforms
from core.structured.grammar import GrammarError, compile_spec
from core.structured.integer_range import integer_bounds, integer_range_pattern
from core.structured.specs import json_schema_spec

RANGES = [(0, None), (1, None), (None, 0), (None, -1), (None, None), (-5, 5), (1, 12), (0, 0), (-1, -1),
          (10, 99), (99, 100), (123, 4567), (-4567, -123), (-100, None), (None, 100), (1000, None),
          (None, -1000), (-10**18, 10**18)]


def _random_ranges(count: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(7)
    out = []
    for _ in range(count):
        low = int(rng.integers(-(10 ** int(rng.integers(0, 7))), 10 ** int(rng.integers(0, 7)) + 1))
        out.append((low, low + int(rng.integers(0, 10 ** int(rng.integers(0, 7)) + 1))))
    return out


@pytest.mark.parametrize("low, high", RANGES + _random_ranges(120))
def test_a_range_pattern_matches_exactly_its_integers_as_json_writes_them(low, high):
    pattern = re.compile(integer_range_pattern(low, high))
    probes = set(range(-150, 150)) | {10**k + d for k in range(19) for d in (-1, 0, 1)}
    probes |= {-p for p in probes}
    for bound in (low, high):
        if bound is not None:
            probes |= set(range(bound - 25, bound + 26))
    for n in probes:
        inside = (low is None or n >= low) and (high is None or n <= high)
        assert bool(pattern.fullmatch(str(n))) == inside, (low, high, n)
    for text in ("-0", "00", "01", "-01", "", "-", "+1", "1.0", "1e2"):
        assert not pattern.fullmatch(text), (low, high, text)


@pytest.mark.parametrize("schema, bounds", [
    ({"minimum": 1, "maximum": 12}, (1, 12)),
    ({"minimum": 0.5, "maximum": 2.5}, (1, 2)),
    ({"exclusiveMinimum": 0, "exclusiveMaximum": 10}, (1, 9)),
    ({"exclusiveMinimum": 0.5, "exclusiveMaximum": 9.5}, (1, 9)),
    ({"minimum": 3, "exclusiveMinimum": 5}, (6, None)),  # both: the tighter
    ({"minimum": 0, "exclusiveMinimum": True, "maximum": 10, "exclusiveMaximum": True}, (1, 9)),  # draft 4
    ({"minimum": 0, "exclusiveMinimum": False}, (0, None)),
    ({"maximum": -3}, (None, -3)),
    ({}, (None, None)),
])
def test_bounds_read_as_json_schema_means_them(schema, bounds):
    assert integer_bounds(schema) == bounds


@pytest.mark.parametrize("schema, words", [
    ({"type": "integer", "minimum": "1"}, ["minimum must be a number"]),
    ({"type": "integer", "maximum": True}, ["maximum must be a number"]),
    ({"type": "integer", "minimum": float("nan")}, ["minimum"]),
    ({"type": "integer", "minimum": 1e30}, ["minimum", "beyond"]),
    ({"type": "integer", "minimum": 5, "maximum": 4}, ["no integer lies between", "minimum 5", "maximum 4"]),
    ({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}, ["no integer lies between"]),
    ({"type": "number", "minimum": 0}, ["'minimum'", "integers only"]),
    ({"maximum": 3}, ["'maximum'", "integers only"]),  # no type: the bound would go unenforced
    ({"type": "object", "properties": {"x": {"type": ["number", "null"], "exclusiveMaximum": 1}}},
     ["properties.x", "'exclusiveMaximum'"]),
])
def test_bounds_that_cannot_be_enforced_are_refused_with_the_keyword_named(schema, words):
    with pytest.raises(GrammarError) as info:
        compile_spec(json_schema_spec(schema))
    assert all(word in str(info.value) for word in words), str(info.value)


MONTH = {"type": "object", "properties": {"month": {"type": "integer", "minimum": 1, "maximum": 12},
                                          "delta": {"type": ["integer", "null"], "minimum": -5,
                                                    "exclusiveMaximum": 5}},
         "required": ["month"]}


def _verdict(schema: dict, text: str) -> str:
    grammar = compile_spec(json_schema_spec(schema))
    state = grammar.automaton.advance_bytes(grammar.initial, text.encode())
    if not state:
        return "rejected"
    return "complete" if grammar.automaton.can_end(state) else "prefix"


@pytest.mark.parametrize("text, expected", [
    ('{"month": 12}', "complete"), ('{"month": 1, "delta": -5}', "complete"),
    ('{"month": 7, "delta": null}', "complete"), ('{"month":3,"delta":4}', "complete"),
    ('{"month": 1\n}', "complete"), ('{"month": 1', "prefix"),
    ('{"month": 13}', "rejected"), ('{"month": 0}', "rejected"), ('{"month": 01}', "rejected"),
    ('{"month": -1}', "rejected"), ('{"month": 1.5}', "rejected"), ('{"month": 1e1}', "rejected"),
    ('{"month": 2, "delta": 5}', "rejected"), ('{"month": 2, "delta": -6}', "rejected"),
    ('{"month": 2, "delta": -0}', "rejected"),
])
def test_an_object_takes_its_integers_within_their_bounds_only(text, expected):
    assert _verdict(MONTH, text) == expected
    if expected == "complete":
        assert conforms(json.loads(text), MONTH)


def test_a_bounded_integer_may_be_the_whole_output_and_ends_where_no_digit_may_follow():
    schema = {"type": "integer", "minimum": 10, "maximum": 20}
    assert [_verdict(schema, t) for t in ("1", "10", "15", "20", "21", "200", "9")] == [
        "prefix", "complete", "complete", "complete", "rejected", "rejected", "rejected"]
    assert _verdict({"type": "array", "items": schema}, "[10, 20,11]") == "complete"
    assert _verdict({"type": "array", "items": schema}, "[10, 2]") == "rejected"


def test_the_schema_check_reads_bounds_as_the_grammar_does():
    assert conforms(5, {"type": "integer", "minimum": 5}) and not conforms(5, {"type": "integer",
                                                                              "exclusiveMinimum": 5})
    assert not conforms(0, {"type": "integer", "minimum": 0, "exclusiveMinimum": True})
    assert conforms(2.5, {"type": "number", "maximum": 3}) and not conforms(3, {"type": "number",
                                                                               "exclusiveMaximum": 3})
