"""Bounds in JSON schemas (minimum, maximum, exclusiveMinimum, exclusiveMaximum) on integers and
numbers: the pattern of a range against Python's own (Decimal) comparison, the bounds' reading, and
the grammar's verdicts."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import numpy as np
import pytest
from test_structured_grammar import verdict

from benchmarks.lib.schema_check import conforms
from core.structured.grammar import GrammarError, compile_spec
from core.structured.numeric_ranges import (
    integer_bounds,
    integer_range_pattern,
    number_bounds,
    number_range_pattern,
)
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
    ({"type": "number", "minimum": 1e-300}, ["minimum 1e-300", "more than 20 fraction digits"]),
    ({"maximum": 1e-21}, ["maximum 1e-21", "fraction digits"]),  # no type: a number's bounds
    ({"type": "object", "properties": {"x": {"type": ["number", "null"], "exclusiveMaximum": 1.5e-25}}},
     ["properties.x", "exclusiveMaximum 1.5e-25"]),
    ({"type": "number", "minimum": 1, "exclusiveMaximum": 1}, ["no number lies between"]),
    ({"type": "number", "minimum": 0.5, "exclusiveMaximum": 0.5}, ["no number lies between", "minimum 0.5"]),
    ({"type": "number", "exclusiveMinimum": 0.75, "maximum": 0.25}, ["no number lies between",
                                                                     "exclusiveMinimum 0.75"]),
])
def test_bounds_that_cannot_be_enforced_are_refused_with_the_keyword_named(schema, words):
    with pytest.raises(GrammarError) as info:
        compile_spec(json_schema_spec(schema))
    assert all(word in str(info.value) for word in words), str(info.value)


MONTH = {"type": "object", "properties": {"month": {"type": "integer", "minimum": 1, "maximum": 12},
                                          "delta": {"type": ["integer", "null"], "minimum": -5,
                                                    "exclusiveMaximum": 5}},
         "required": ["month"]}


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
    assert schema_verdict(MONTH, text) == expected
    if expected == "complete":
        assert conforms(json.loads(text), MONTH)


def test_a_bounded_integer_may_be_the_whole_output_and_ends_where_no_digit_may_follow():
    schema = {"type": "integer", "minimum": 10, "maximum": 20}
    assert [schema_verdict(schema, t) for t in ("1", "10", "15", "20", "21", "200", "9")] == [
        "prefix", "complete", "complete", "complete", "rejected", "rejected", "rejected"]
    assert schema_verdict({"type": "array", "items": schema}, "[10, 20,11]") == "complete"
    assert schema_verdict({"type": "array", "items": schema}, "[10, 2]") == "rejected"


def test_the_schema_check_reads_bounds_as_the_grammar_does():
    assert conforms(5, {"type": "integer", "minimum": 5}) and not conforms(5, {"type": "integer",
                                                                              "exclusiveMinimum": 5})
    assert not conforms(0, {"type": "integer", "minimum": 0, "exclusiveMinimum": True})
    assert conforms(2.5, {"type": "number", "maximum": 3}) and not conforms(3, {"type": "number",
                                                                               "exclusiveMaximum": 3})
    assert conforms(0.1, {"type": "number", "minimum": 0.1}) and not conforms(0.1, {"exclusiveMinimum": 0.1,
                                                                                     "type": "number"})
    assert conforms(1, {"type": "number", "exclusiveMinimum": 0.5, "maximum": 1.0})
    assert not conforms(-0.75, {"type": "number", "maximum": -0.5, "exclusiveMinimum": -0.75})


FRACTIONS = ("", ".0", ".00", ".5", ".05", ".001", ".999")
NUMBER_PROBES = [f"{n}{fraction}" for n in range(-14, 15) for fraction in FRACTIONS]
# Never JSON as Cadence writes it (no "-0", no leading zeros, no exponent), whatever the bounds.
MALFORMED = ("01", "1.", ".5", "1e2", "+1", "-", "-0", "-0.0", "-0.000", "00.5", "-00.5", "0.5e0", "0..5")


def _inside(x: Decimal, low, low_exclusive: bool, high, high_exclusive: bool) -> bool:
    return ((low is None or (x > low if low_exclusive else x >= low))
            and (high is None or (x < high if high_exclusive else x <= high)))


def _near(bounds) -> list[str]:
    """Each bound, and the bound +- 10^-k for k = 1..10, written plainly and with trailing zeros."""
    texts = []
    for bound in bounds:
        if bound is None:
            continue
        for x in [bound] + [bound + sign * Decimal(10) ** -k for k in range(1, 11) for sign in (-1, 1)]:
            text = format(x, "f")
            texts += [text, text + ("0" if "." in text else ".0"), text + ("00" if "." in text else ".00")]
    return texts


def check_number_range(low, low_exclusive: bool, high, high_exclusive: bool) -> None:
    """The pattern of the bounds (Decimal, None: unbounded) takes a probe exactly where Decimal's
    comparison puts it inside: the integers and fractions near 0 and every probe near a bound."""
    empty = low is not None and high is not None and (
        low > high or (low == high and (low_exclusive or high_exclusive)))
    if empty:
        with pytest.raises(ValueError):
            number_range_pattern(low, low_exclusive, high, high_exclusive)
        return
    pattern = re.compile(number_range_pattern(low, low_exclusive, high, high_exclusive))
    for text in NUMBER_PROBES + _near((low, high)):
        if text.startswith("-") and Decimal(text) == 0:  # "-0.0": JSON's but never written here
            assert not pattern.fullmatch(text), text
            continue
        inside = _inside(Decimal(text), low, low_exclusive, high, high_exclusive)
        assert bool(pattern.fullmatch(text)) == inside, (low, low_exclusive, high, high_exclusive, text)
    for text in MALFORMED:
        assert not pattern.fullmatch(text), text


@pytest.mark.parametrize("low", [None, -7, -1, 0, 1, 5])
@pytest.mark.parametrize("high", [None, -3, 0, 1, 12])
@pytest.mark.parametrize("low_exclusive", [False, True])
@pytest.mark.parametrize("high_exclusive", [False, True])
def test_a_number_range_pattern_matches_exactly_the_decimals_within_it(low, high, low_exclusive,
                                                                       high_exclusive):
    check_number_range(None if low is None else Decimal(low), low_exclusive,
                       None if high is None else Decimal(high), high_exclusive)


FRACTIONAL_LOWS = [None, "-2.75", "-0.5", "0", "0.05", "0.125", "0.25", "0.5", "1.5", "3.14159"]
FRACTIONAL_HIGHS = [None, "-0.5", "-0.25", "0", "0.5", "0.75", "1", "1.5", "3.14159", "12.5"]


@pytest.mark.parametrize("low", FRACTIONAL_LOWS)
@pytest.mark.parametrize("high", FRACTIONAL_HIGHS)
@pytest.mark.parametrize("low_exclusive", [False, True])
@pytest.mark.parametrize("high_exclusive", [False, True])
def test_fractional_bounds_match_exactly_the_decimals_within_them(low, high, low_exclusive, high_exclusive):
    """Same and different integer parts, both sides of zero, one-sided, a bound on an integer."""
    check_number_range(None if low is None else Decimal(low), low_exclusive,
                       None if high is None else Decimal(high), high_exclusive)


def _random_decimal_ranges(count: int) -> list[tuple[Decimal, Decimal]]:
    """Bounds of up to 9 fraction digits, below a million in size, nearly half sharing their integer part."""
    rng = np.random.default_rng(11)
    out = []
    for _ in range(count):
        places = int(rng.integers(0, 7))
        low = Decimal(int(rng.integers(-10**6, 10**6))).scaleb(-places - int(rng.integers(0, 4)))
        width = Decimal(int(rng.integers(0, 10 ** int(rng.integers(1, 7))))).scaleb(-int(rng.integers(0, 7)))
        out.append((low, low + width))
    return out


@pytest.mark.parametrize("low, high", _random_decimal_ranges(100))
@pytest.mark.parametrize("low_exclusive, high_exclusive", [(False, False), (True, True), (False, True)])
def test_random_fractional_bounds_match_exactly_the_decimals_within_them(low, high, low_exclusive,
                                                                         high_exclusive):
    check_number_range(low, low_exclusive, high, high_exclusive)


@pytest.mark.parametrize("schema, bounds", [
    ({"minimum": 0, "maximum": 1}, (0, False, 1, False)),
    ({"exclusiveMinimum": 0}, (0, True, None, False)),
    ({"minimum": 0, "exclusiveMinimum": True}, (0, True, None, False)),  # draft 4
    ({"minimum": 3, "exclusiveMinimum": 3}, (3, True, None, False)),  # a tie: exclusive
    ({"maximum": 5.0, "exclusiveMaximum": 4}, (None, False, 4, True)),
    ({"minimum": 0.1, "exclusiveMaximum": 0.9}, (Decimal("0.1"), False, Decimal("0.9"), True)),  # as written
    ({"minimum": 0.25, "exclusiveMinimum": 0.2}, (Decimal("0.25"), False, None, False)),
    ({"maximum": 0.5, "exclusiveMaximum": 0.5}, (None, False, Decimal("0.5"), True)),
    ({"maximum": 2.5, "exclusiveMaximum": True}, (None, False, Decimal("2.5"), True)),  # draft 4
    ({"minimum": -0.0}, (0, False, None, False)),
    ({"minimum": 1e-20}, (Decimal("1e-20"), False, None, False)),  # the most fraction digits taken
])
def test_number_bounds_read_as_json_schema_means_them(schema, bounds):
    assert number_bounds(schema) == bounds


def test_bounds_of_the_most_digits_a_double_writes_fit_the_pattern_limit_and_hold_to_the_last_digit():
    high = {"type": "number", "minimum": -98765432109876.55, "maximum": 0.30000000000000004}
    assert [schema_verdict(high, t) for t in ("0.30000000000000004", "0.30000000000000005",
                                              "-98765432109876.55", "-98765432109876.551")] == [
        "complete", "rejected", "complete", "rejected"]
    low = {"type": "number", "exclusiveMinimum": -1.2345678901234567e-4,
           "exclusiveMaximum": 9.876543210987654e16}
    assert [schema_verdict(low, t) for t in ("-0.00012345678901234567", "-0.00012345678901234566",
                                             "98765432109876539.99", "98765432109876540")] == [
        "rejected", "complete", "complete", "rejected"]


SCORE = {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1},
                                          "gain": {"type": "number", "exclusiveMinimum": 0}},
         "required": ["score"]}


SCORE_CASES = [
    ('{"score": 0.75}', "complete"), ('{"score": 1}', "complete"), ('{"score": 1.000}', "complete"),
    ('{"score": 0, "gain": 0.001}', "complete"), ('{"score": 0.5, "gain": 12}', "complete"),
    ('{"score": 1.01}', "rejected"), ('{"score": -0.5}', "rejected"), ('{"score": 2}', "rejected"),
    ('{"score": 1e-3}', "rejected"), ('{"score": 0.5, "gain": 0}', "rejected"),
    ('{"score": 0.5, "gain": 0.000}', "rejected"), ('{"score": 0.', "prefix"),
]


# pydantic's confloat(gt=0.05, le=0.95) and Field(ge=-2.75, lt=-0.5)
SHARE = {"type": "object", "properties": {
    "p": {"type": "number", "exclusiveMinimum": 0.05, "maximum": 0.95},
    "t": {"type": "number", "minimum": -2.75, "exclusiveMaximum": -0.5},
}, "required": ["p"]}


SHARE_CASES = [
    ('{"p": 0.5}', "complete"), ('{"p": 0.950}', "complete"), ('{"p": 0.0500001}', "complete"),
    ('{"p": 0.05', "prefix"), ('{"p": 0.0', "prefix"), ('{"p": 0.', "prefix"),
    ('{"p": 0.05}', "rejected"), ('{"p": 0.04', "rejected"), ('{"p": 0.9501', "rejected"),
    ('{"p": 0.96', "rejected"), ('{"p": 1', "rejected"), ('{"p": 0}', "rejected"),
    ('{"p": 0.5, "t": -2.75}', "complete"), ('{"p": 0.5, "t": -0.50001}', "complete"),
    ('{"p": 0.5, "t": -1}', "complete"), ('{"p": 0.5, "t": -0.5}', "rejected"),
    ('{"p": 0.5, "t": -2.7501', "rejected"), ('{"p": 0.5, "t": -3', "rejected"),
    ('{"p": 0.5, "t": 0', "rejected"), ('{"p": 0.5, "t": -0.4', "rejected"),
]


@pytest.mark.parametrize("schema, text, expected", [(SCORE, *case) for case in SCORE_CASES]
                         + [(SHARE, *case) for case in SHARE_CASES])
def test_an_object_takes_its_numbers_within_their_bounds_only(schema, text, expected):
    assert schema_verdict(schema, text) == expected
    if expected == "complete":
        assert conforms(json.loads(text), schema)


def schema_verdict(schema: dict, text: str) -> str:
    return verdict(json_schema_spec(schema), text)

