"""A JSON schema's bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum) as a regular
expression over the number's JSON text.

`integer_range_pattern(low, high)` matches exactly the integers low..high (None: unbounded on that
side) written as JSON writes them: an optional minus, no leading zeros, no "-0";
`number_range_pattern` the decimals between whole-number bounds (no exponent). The grammar steps
them as bare patterns inside JSON (core/structured/pattern_frames.py: the number ends at the first
byte the pattern cannot take), so `{"type": "integer", "minimum": 1, "maximum": 12}` can only
produce 1 to 12. Used by core/structured/grammar.py.
"""

from __future__ import annotations

import math

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


def number_range_pattern(low: int | None, low_exclusive: bool, high: int | None, high_exclusive: bool) -> str:
    """The JSON numbers (an optional fraction, no exponent) between whole-number bounds (None: no
    bound; exclusive or not), as alternatives of one group: a negative part over magnitudes, then
    a non-negative one."""
    parts = []
    if low is None or low < 0:  # x = -m: x >= low is m <= -low; x <= high < 0 is m >= -high
        if high is None or high >= 0:
            magnitude_low, magnitude_low_exclusive = 0, True  # m > 0: no "-0"
        else:
            magnitude_low, magnitude_low_exclusive = -high, high_exclusive
        magnitude_high = None if low is None else -low
        parts += ["-" + p for p in _magnitudes(magnitude_low, magnitude_low_exclusive, magnitude_high,
                                               low_exclusive)]
    if high is None or high >= 0:
        start, start_exclusive = (0, False) if low is None or low < 0 else (low, low_exclusive)
        parts += _magnitudes(start, start_exclusive, high, high_exclusive)
    if not parts:
        raise ValueError(f"no number lies in {low}..{high}")
    return "(" + "|".join(parts) + ")"


def _magnitudes(low: int, low_exclusive: bool, high: int | None, high_exclusive: bool) -> list[str]:
    """Patterns of the non-negative decimals m with low <(=) m <(=) high (0 <= low; high None: no
    bound), written as an integer part and an optional fraction."""
    if high is not None and (high < low or (high == low and (low_exclusive or high_exclusive))):
        return []
    if high == low:
        return [f"{low}(\\.0+)?"]
    parts = [f"{low}\\.[0-9]*[1-9][0-9]*" if low_exclusive else f"{low}{FRACTION}"]  # integer part low
    middle_high = None if high is None else high - 1  # integer parts strictly between: any fraction
    if middle_high is None or middle_high >= low + 1:
        parts += [f"({p}){FRACTION}" for p in _at_least(low + 1, middle_high)]
    if high is not None and not high_exclusive:
        parts.append(f"{high}(\\.0+)?")
    return parts


def number_bounds(schema: dict) -> tuple[int | None, bool, int | None, bool]:
    """A number schema's bounds as (low, low exclusive, high, high exclusive), None where unbounded:
    whole numbers only (a fractional bound is refused: the patterns compare integer parts).
    ValueError names the keyword."""
    values = _bound_values(schema)
    for word, value in values.items():
        if not isinstance(value, bool) and value != int(value):
            raise ValueError(f"{word} {value!r}: a number's bounds are enforced where they are whole "
                             "numbers (an integer's may be any)")
    low, low_exclusive = _tighter(values, "minimum", "exclusiveMinimum", max)
    high, high_exclusive = _tighter(values, "maximum", "exclusiveMaximum", min)
    if low is not None and high is not None and (low > high or (low == high and (low_exclusive
                                                                                  or high_exclusive))):
        given = ", ".join(f"{word} {value}" for word, value in values.items())
        raise ValueError(f"no number lies between the bounds ({given})")
    return low, low_exclusive, high, high_exclusive


def _tighter(values: dict, inclusive_word: str, exclusive_word: str, pick) -> tuple[int | None, bool]:
    """One side's bound from its inclusive and exclusive keywords: the tighter, exclusive on a tie."""
    inclusive, exclusive = values.get(inclusive_word), values.get(exclusive_word)
    if isinstance(exclusive, bool):  # draft 4: the flag makes the inclusive keyword exclusive
        return (None, False) if inclusive is None else (int(inclusive), exclusive)
    if inclusive is None:
        return (None, False) if exclusive is None else (int(exclusive), True)
    if exclusive is None:
        return int(inclusive), False
    bound = pick(int(inclusive), int(exclusive))
    return bound, bound == int(exclusive)

