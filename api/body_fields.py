"""BodyFields: typed access to a JSON request body whose every error names the field.

api/protocol.py reads each OpenAI request through one: `fields.int("n", 1, 64)`, `fields.float(...)`,
`fields.bool(...)`, `fields.str(...)`, `fields.get(...)` for the rest. A field given as null counts
as left out; a field the endpoint does not know is refused when the body is wrapped. Every
refusal is an ApiError (400) whose `param` is the field and whose message says what was expected
and what came, in JSON's words ("'n' must be an integer, got a string \"2\"").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from api.errors import invalid

_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
               float: "a number", type(None): "null"}


def describe(value: Any) -> str:
    kind = _JSON_TYPES.get(type(value), type(value).__name__)
    shown = orjson.dumps(value).decode() if not isinstance(value, dict | list) else ""
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{kind} {shown}".rstrip()


class BodyFields:
    """Typed access to a request body's top-level fields; every error names the field."""

    def __init__(self, body: Any, known: frozenset[str], endpoint: str) -> None:
        if not isinstance(body, dict):
            raise invalid(None, f"the request body must be a JSON object, got {describe(body)}")
        unknown = sorted(set(body) - known)
        if unknown:
            raise invalid(unknown[0], f"unrecognized request argument {unknown[0]!r} for {endpoint}")
        self._body = body

    def get(self, name: str, *, required: bool = False) -> Any:
        value = self._body.get(name)
        if value is None and required:
            raise invalid(name, f"{name!r} is a required field")
        return value

    def int(self, name: str, minimum: int | None, maximum: int | None,
            default: int | None = None) -> int | None:
        value = self._body.get(name)
        if value is None:
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 16.0 is 16 in JSON's eyes
        if not isinstance(value, int) or isinstance(value, bool):
            raise invalid(name, f"{name!r} must be an integer, got {describe(value)}")
        if minimum is not None and value < minimum or maximum is not None and value > maximum:
            low = "" if minimum is None else f">= {minimum}"
            high = "" if maximum is None else f"<= {maximum}"
            raise invalid(name, f"{name!r} must be {' and '.join(s for s in (low, high) if s)}, got {value}")
        return value

    def float(self, name: str, default: float) -> float:
        value = self._body.get(name)
        if value is None:
            return default
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise invalid(name, f"{name!r} must be a number, got {describe(value)}")
        return float(value)

    def bool(self, name: str, default: bool) -> bool:
        value = self._body.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise invalid(name, f"{name!r} must be a boolean, got {describe(value)}")
        return value

    def str(self, name: str) -> str | None:
        value = self._body.get(name)
        if value is not None and not isinstance(value, str):
            raise invalid(name, f"{name!r} must be a string, got {describe(value)}")
        return value


def require_noop(fields: BodyFields, name: str, allowed: Sequence[Any], why: str) -> None:
    value = fields.get(name)
    if value is not None and value not in allowed:
        raise invalid(name, f"{why}; got {name}={orjson.dumps(value).decode()[:80]}")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_token_id(value: Any) -> bool:
    return is_int(value) and value >= 0
