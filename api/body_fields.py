"""BodyFields: typed access to a JSON request body whose every error names the field.

api/protocol.py reads each OpenAI request through one: `fields.int("n", 1, 64)`, `fields.float(...)`,
`fields.bool(...)`, `fields.str(...)`, `fields.get(...)` for the rest. A field given as null counts
as left out. A field the endpoint does not know is ignored with one warning per field name, as
vLLM does (routers and SDKs add fields of their own: the SGLang gateway sends `no_stop_trim`), or,
with `strict` (`cadence serve --strict-request-fields`), refused when the body is wrapped. Every
refusal is an ApiError (400) whose `param` is the field and whose message says what was expected
and what came, in JSON's words ("'n' must be an integer, got a string \"2\"").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson

from api.errors import invalid

log = logging.getLogger("cadence.api")
# A client that sends a fresh made-up name in every body must not grow the set without bound.
_MAX_WARNED_NAMES = 256

_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
               float: "a number", type(None): "null"}


def describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict | list) and not value:
        return f"an empty {'object' if isinstance(value, dict) else 'array'}"
    kind = _JSON_TYPES.get(type(value), type(value).__name__)
    shown = orjson.dumps(value).decode() if not isinstance(value, dict | list) else ""
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{kind} {shown}".rstrip()


class BodyFields:
    """Typed access to a request body's top-level fields; every error names the field."""

    def __init__(self, body: Any, known: frozenset[str], endpoint: str, *, strict: bool) -> None:
        if not isinstance(body, dict):
            raise invalid(None, f"the request body must be a JSON object, got {describe(body)}")
        check_unknown(set(body) - known, endpoint, strict, "request argument", "")
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


class IgnoredFieldLog:
    """Warns once per (where, name) about fields this server ignores; stops naming new ones after
    _MAX_WARNED_NAMES, with one last warning saying so."""

    def __init__(self) -> None:
        self._warned: set[tuple[str, str]] = set()

    def warn(self, where: str, names: list[str]) -> None:
        fresh = [n for n in names if (where, n) not in self._warned]
        if not fresh or len(self._warned) > _MAX_WARNED_NAMES:
            return
        self._warned.update((where, n) for n in fresh)
        shown = ", ".join(repr(n) for n in fresh)
        log.warning("ignoring unrecognized field(s) %s of %s (warned once per field; "
                    "--strict-request-fields refuses them)", shown, where)
        if len(self._warned) > _MAX_WARNED_NAMES:
            log.warning("more than %d unrecognized field names seen; further ones are ignored silently",
                        _MAX_WARNED_NAMES)


IGNORED_FIELDS = IgnoredFieldLog()


def check_unknown(unknown: set[str], where: str, strict: bool, kind: str, prefix: str) -> None:
    """Refuse (strict) or ignore with a warning the fields of `where` that this server does not know;
    `prefix` names the object they sit in ("stream_options.") for the error's param."""
    if not unknown:
        return
    names = sorted(unknown)
    if strict:
        raise invalid(f"{prefix}{names[0]}", f"unrecognized {kind} {names[0]!r} for {where}")
    IGNORED_FIELDS.warn(where, [f"{prefix}{n}" for n in names])


def require_noop(fields: BodyFields, name: str, allowed: Sequence[Any], why: str) -> None:
    value = fields.get(name)
    if value is not None and value not in allowed:
        raise invalid(name, f"{why}; got {name}={orjson.dumps(value).decode()[:80]}")


def joined_text(content: Any, where: str, kinds: tuple[str, ...], noun: str) -> str:
    """A content given as a string, or as an array of text parts (their `type` one of `kinds`)
    joined with newlines, as the chat, Responses and Messages APIs all allow; else ApiError naming
    the part. `noun` is what the API calls a part ("text part", "text block")."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(where, f"'{where}' must be a string or an array of {noun}s, got {describe(content)}")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise invalid(at, f"'{at}' must be a {noun} {{'type': '{kinds[0]}', 'text': ...}}; got type "
                          f"{kind!r} (only text is supported)")
        if not isinstance(part.get("text"), str):
            raise invalid(f"{at}.text", f"'{at}.text' must be a string")
        texts.append(part["text"])
    return "\n".join(texts)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_token_id(value: Any) -> bool:
    return is_int(value) and value >= 0


def all_ints(values: list) -> bool:
    """Whether every item is an int (not a bool), in one C-level pass: a prompt's 2,000 token ids
    cost ~30 us here where a Python check per item costs ten times that."""
    return list(map(type, values)).count(int) == len(values)


def first_bad_token_id(values: list) -> int | None:
    """The index of the first item that is not a non-negative int token id, or None."""
    if all_ints(values) and (not values or min(values) >= 0):
        return None
    return next(j for j, t in enumerate(values) if not is_token_id(t))
