"""A JSON schema's bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum) as a regular
expression over the number's JSON text.

`integer_range_pattern(low, high)` matches exactly the integers low..high (None: unbounded on that
side) written as JSON writes them: an optional minus, no leading zeros, no "-0";
`number_range_pattern` the decimals between any two bounds (an integer part, an optional fraction,
no exponent), comparing the fraction's digits with the bounds' digit by digit. The grammar steps
them as bare patterns inside JSON (core/structured/pattern_frames.py: the number ends at the first
byte the pattern cannot take), so `{"type": "integer", "minimum": 1, "maximum": 12}` can only
produce 1 to 12, and `{"type": "number", "exclusiveMinimum": 0.25}` no 0.25 or 0.2. Used by
core/structured/grammar.py.
"""

from __future__ import annotations

import math
from decimal import Decimal

ANY_POSITIVE = "[1-9][0-9]*"


def integer_range_pattern(low: int | None, high: int | None) -> str:
    """The integers low..high (inclusive; None: no bound), as alternatives of one group."""
    if low is not None and high is not None and low > high:
        raise ValueError(f"no integer lies in {low}..{high}")
    parts = []
    if low is None or low < 0:  # the negative ones: -n for n in max(1, -high)..-low
        smallest = 1 if high is None or high >= 0 else -high
        parts += ["-" + p for p in _at_least(smallest, None if low is None else -low)]
    if high is None or high >= 0:
        parts += _at_least(max(low or 0, 0), high)
    return "(" + "|".join(parts) + ")"


def _at_least(low: int, high: int | None) -> list[str]:
    """Patterns of the integers low..high (0 <= low; high None: unbounded), no leading zeros."""
    parts = []
    if low == 0:
        parts.append("0")
        low = 1
    if high is not None and low > high:
        return parts
    digits = len(str(low))
    while True:
        top = 10**digits - 1
        if high is not None and high <= top:
            return parts + _same_length(str(low), str(high))
        parts += _same_length(str(low), str(top))
        if high is None:  # and every longer number
            return parts + [f"[1-9][0-9]{{{digits},}}"]
        low, digits = top + 1, digits + 1


def _same_length(low: str, high: str) -> list[str]:
    """Patterns of the numbers low..high, both written with the same number of digits."""
    if len(low) == 1:
        return [low if low == high else f"[{low}-{high}]"]
    if low[0] == high[0]:
        return [low[0] + p for p in _same_length(low[1:], high[1:])]
    rest = len(low) - 1
    parts, first, last = [], int(low[0]), int(high[0])
    if low[1:] != "0" * rest:  # low's first digit with the tails from low's up
        parts += [low[0] + p for p in _same_length(low[1:], "9" * rest)]
        first += 1
    tail_high = high[1:] != "9" * rest
    if tail_high:
        last -= 1
    if first <= last:  # whole first digits, any tail
        lead = str(first) if first == last else f"[{first}-{last}]"
        parts.append(lead + "[0-9]" * rest)
    if tail_high:  # high's first digit with the tails up to high's
        parts += [high[0] + p for p in _same_length("0" * rest, high[1:])]
    return parts


BOUND_WORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
LARGEST_BOUND = 10**18  # beyond it a bound is refused: JSON parsers read such integers inexactly anyway


def _bound_values(schema: dict) -> dict:
    """The schema's bound keywords that are set, checked: numbers (draft 4's booleans for the
    exclusives), none beyond LARGEST_BOUND; ValueError names the keyword."""
    values = {}
    for word in BOUND_WORDS:
        value = schema.get(word)
        if value is None:
            continue
        if isinstance(value, bool) and word.startswith("exclusive"):
            values[word] = value
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            raise ValueError(f"{word} must be a number, got {value!r}")
        if abs(value) > LARGEST_BOUND:
            raise ValueError(f"{word} {value!r} is beyond the {LARGEST_BOUND:.0e} served")
        values[word] = value
    return values


def integer_bounds(schema: dict) -> tuple[int | None, int | None]:
    """The integers an integer schema's minimum, maximum, exclusiveMinimum and exclusiveMaximum
    (a number each, or draft 4's boolean exclusives) allow: (low, high), None where unbounded.
    ValueError names the keyword that is malformed, out of range or leaves no integer."""
    values = _bound_values(schema)
    low = high = None
    if "minimum" in values:
        exclusive = values.get("exclusiveMinimum") is True
        low = math.floor(values["minimum"]) + 1 if exclusive else math.ceil(values["minimum"])
    if not isinstance(values.get("exclusiveMinimum", True), bool):
        low = max(math.floor(values["exclusiveMinimum"]) + 1, low if low is not None else -LARGEST_BOUND - 1)
    if "maximum" in values:
        exclusive = values.get("exclusiveMaximum") is True
        high = math.ceil(values["maximum"]) - 1 if exclusive else math.floor(values["maximum"])
    if not isinstance(values.get("exclusiveMaximum", True), bool):
        high = min(math.ceil(values["exclusiveMaximum"]) - 1, high if high is not None else LARGEST_BOUND + 1)
    if low is not None and high is not None and low > high:
        given = ", ".join(f"{word} {value}" for word, value in values.items())
        raise ValueError(f"no integer lies between the bounds ({given})")
    return low, high


FRACTION = r"(\.[0-9]+)?"  # a number's optional fraction; no exponent is generated
# A number bound's most fraction digits (the pattern is as deep as the bound's digits: 1e-300 would
# be 300 deep); a double's shortest text has 17 significant digits at most, so 1.2345678901234567e-4 fits.
MAX_FRACTION_DIGITS = 20


def number_range_pattern(low: Decimal | None, low_exclusive: bool, high: Decimal | None,
                         high_exclusive: bool) -> str:
    """The JSON numbers (an optional fraction, no exponent) between the bounds (None: no bound;
    exclusive or not), as alternatives of one group: a negative part over magnitudes, then a
    non-negative one."""
    parts = []
    if low is None or low < 0:  # x = -m: x >= low is m <= -low; x <= high < 0 is m >= -high
        if high is None or high >= 0:
            magnitude_low, magnitude_low_exclusive = Decimal(0), True  # m > 0: no "-0"
        else:
            magnitude_low, magnitude_low_exclusive = -high, high_exclusive
        magnitude_high = None if low is None else -low
        parts += ["-" + p for p in _magnitudes(magnitude_low, magnitude_low_exclusive, magnitude_high,
                                               low_exclusive)]
    if high is None or high >= 0:
        start, start_exclusive = (Decimal(0), False) if low is None or low < 0 else (low, low_exclusive)
        parts += _magnitudes(start, start_exclusive, high, high_exclusive)
    if not parts:
        raise ValueError(f"no number lies in {low}..{high}")
    return "(" + "|".join(parts) + ")"


def _magnitudes(low: Decimal, low_exclusive: bool, high: Decimal | None, high_exclusive: bool) -> list[str]:
    """Patterns of the non-negative decimals m with low <(=) m <(=) high (0 <= low; high None: no
    bound), written as an integer part and an optional fraction: the low bound's integer part with
    the fractions from its up, the integer parts strictly between with any, the high bound's with
    the fractions up to its (one integer part with the fractions between both, where they share it)."""
    if high is not None and (high < low or (high == low and (low_exclusive or high_exclusive))):
        return []
    low_whole, low_digits = _split(low)
    high_whole, high_digits = (None, None) if high is None else _split(high)
    if high_whole == low_whole:
        return [f"{low_whole}{_fraction(low_digits, low_exclusive, high_digits, high_exclusive)}"]
    parts = [f"{low_whole}{_fraction(low_digits, low_exclusive, None, False)}"]
    middle_high = None if high_whole is None else high_whole - 1  # strictly between: any fraction
    if middle_high is None or middle_high >= low_whole + 1:
        parts += [f"({p}){FRACTION}" for p in _at_least(low_whole + 1, middle_high)]
    if high_whole is not None and (high_digits or not high_exclusive):
        parts.append(f"{high_whole}{_fraction('', False, high_digits, high_exclusive)}")
    return parts


def _split(value: Decimal) -> tuple[int, str]:
    """A non-negative decimal's integer part and its fraction's digits, no trailing zeros:
    2.750 is (2, "75"), 3 is (3, "")."""
    whole = int(value)
    return whole, format(value - whole, "f").partition(".")[2].rstrip("0")


def _fraction(low: str, low_exclusive: bool, high: str | None, high_exclusive: bool) -> str:
    """The pattern of a fraction's text ("" or "." and digits D) with 0.low <(=) 0.D <(=) 0.high
    (fraction digits; high None: below 1); the bounds leave at least one fraction."""
    empty, alternatives = _fraction_digits(low, low_exclusive, high, high_exclusive)
    return f"(\\.({'|'.join(alternatives)}))" + ("?" if empty else "")


def _fraction_digits(low: str, low_exclusive: bool, high: str | None,
                     high_exclusive: bool) -> tuple[bool, list[str]]:
    """The digit strings D with 0.low <(=) 0.D <(=) 0.high (high None: below 1): whether the empty
    one (0) is among them, and patterns of the nonempty ones, by their first digit: the bounds'
    shared first digit followed by what lies between their rests; else low's first digit followed by
    what lies above its rest, the digits strictly between followed by anything, high's first digit
    followed by what lies below its rest. An empty bound stands for 0 (first digit 0, rest empty)."""
    if not low and not high:  # the bounds are 0 (or 1, exclusive, for high None)
        if high is None:
            return (False, ["0*[1-9][0-9]*"]) if low_exclusive else (True, ["[0-9]+"])
        return (True, ["0+"]) if not (low_exclusive or high_exclusive) else (False, [])
    empty = not low and not low_exclusive  # 0 <= 0.high holds, and 0 < 0.high for a nonempty high
    first, low_rest = (int(low[0]), low[1:]) if low else (0, "")
    if high is None:  # any first digit above low's, any rest
        alternatives = [f"{first}{_digits(low_rest, low_exclusive, None, False)}"]
        if first < 9:
            alternatives.append(f"{_digit_class(first + 1, 9)}[0-9]*")
        return empty, alternatives
    last, high_rest = (int(high[0]), high[1:]) if high else (0, "")
    if first == last:
        rest = _digits(low_rest, low_exclusive, high_rest, high_exclusive)
        return empty, [] if rest is None else [f"{first}{rest}"]
    alternatives = [f"{first}{_digits(low_rest, low_exclusive, None, False)}"]
    if first + 1 <= last - 1:
        alternatives.append(f"{_digit_class(first + 1, last - 1)}[0-9]*")
    below = _digits("", False, high_rest, high_exclusive)
    if below is not None:
        alternatives.append(f"{last}{below}")
    return empty, alternatives


def _digits(low: str, low_exclusive: bool, high: str | None, high_exclusive: bool) -> str | None:
    """One pattern of the digit strings `_fraction_digits` finds, the empty one included where it is
    among them (a rest after a first digit may be empty); None where there are none."""
    empty, alternatives = _fraction_digits(low, low_exclusive, high, high_exclusive)
    if not alternatives:  # where the empty string lies between, so do "0", "00", ...: none does
        return None
    return f"({'|'.join(alternatives)})" + ("?" if empty else "")


def _digit_class(first: int, last: int) -> str:
    return str(first) if first == last else f"[{first}-{last}]"


def number_bounds(schema: dict) -> tuple[Decimal | None, bool, Decimal | None, bool]:
    """A number schema's bounds as (low, low exclusive, high, high exclusive), None where unbounded,
    as decimals read from each value's shortest text: a schema's 0.1 is 0.1, not the double nearest
    it. ValueError names the keyword of a bound with more than MAX_FRACTION_DIGITS fraction digits,
    and the bounds where they leave no number."""
    given, values = _bound_values(schema), {}
    for word, value in given.items():
        if isinstance(value, bool):  # draft 4's exclusive flags
            values[word] = value
            continue
        exact = Decimal(str(value)) + 0  # + 0: -0.0 is 0
        if exact != int(exact) and -exact.normalize().as_tuple().exponent > MAX_FRACTION_DIGITS:
            raise ValueError(f"{word} {value!r} has more than {MAX_FRACTION_DIGITS} fraction digits")
        values[word] = exact
    low, low_exclusive = _tighter(values, "minimum", "exclusiveMinimum", max)
    high, high_exclusive = _tighter(values, "maximum", "exclusiveMaximum", min)
    if low is not None and high is not None and (low > high or (low == high and (low_exclusive
                                                                                  or high_exclusive))):
        words = ", ".join(f"{word} {value}" for word, value in given.items())
        raise ValueError(f"no number lies between the bounds ({words})")
    return low, low_exclusive, high, high_exclusive


def _tighter(values: dict, inclusive_word: str, exclusive_word: str, pick) -> tuple[Decimal | None, bool]:
    """One side's bound from its inclusive and exclusive keywords: the tighter, exclusive on a tie."""
    inclusive, exclusive = values.get(inclusive_word), values.get(exclusive_word)
    if isinstance(exclusive, bool):  # draft 4: the flag makes the inclusive keyword exclusive
        return (None, False) if inclusive is None else (inclusive, exclusive)
    if inclusive is None:
        return (None, False) if exclusive is None else (exclusive, True)
    if exclusive is None:
        return inclusive, False
    return (exclusive, True) if pick(inclusive, exclusive) == exclusive else (inclusive, False)
