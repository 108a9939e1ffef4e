"""A small JSON-schema check for structured outputs: does a parsed value satisfy the
subset of JSON schema that core/structured/grammar.py enforces? Written independently of the
automaton, so a test that generates through the masks and checks here tests the two against each
other."""

from __future__ import annotations

import datetime
import ipaddress
import re
import uuid
from typing import Any


def conforms(value: Any, schema: Any, root: dict | None = None) -> bool:
    root = root if root is not None else schema
    if schema is True or schema == {}:
        return True
    if "$ref" in schema:
        section, name = schema["$ref"][2:].split("/", 1)
        return conforms(value, root[section][name], root)
    if "const" in schema:
        return value == schema["const"] and type(value) is type(schema["const"])
    if "enum" in schema:
        return any(value == option and type(value) is type(option) for option in schema["enum"])
    for word in ("anyOf", "oneOf"):
        if word in schema:
            return any(conforms(value, option, root) for option in schema[word])
    if "allOf" in schema:
        return all(conforms(value, part, root) for part in schema["allOf"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return any(conforms(value, {**schema, "type": k}, root) for k in kind)
    if kind is None:
        if "properties" in schema or "additionalProperties" in schema:
            kind = "object"
        elif "items" in schema:
            kind = "array"
        elif "pattern" in schema or "minLength" in schema or "maxLength" in schema:
            kind = "string"
        else:
            return True
    if kind == "object":
        if not isinstance(value, dict):
            return False
        properties = schema.get("properties", {})
        if any(name not in value for name in schema.get("required", [])):
            return False
        for name, item in value.items():
            if name in properties:
                if not conforms(item, properties[name], root):
                    return False
            elif properties or not conforms(item, schema.get("additionalProperties", True), root):
                return False
        return True
    if kind == "array":
        if not isinstance(value, list):
            return False
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            return False
        return all(conforms(item, schema.get("items", True), root) for item in value)
    if kind == "string":
        return (isinstance(value, str) and schema.get("minLength", 0) <= len(value)
                <= schema.get("maxLength", len(value))
                and ("pattern" not in schema or re.search(schema["pattern"], value, re.ASCII) is not None)
                and ("pattern" in schema or "minLength" in schema or "maxLength" in schema
                     or _has_format(value, schema.get("format"))))
    if kind in ("integer", "number"):
        numeric = int if kind == "integer" else int | float
        return isinstance(value, numeric) and not isinstance(value, bool) and _within_bounds(value, schema)
    if kind == "boolean":
        return isinstance(value, bool)
    return value is None


def _within_bounds(value: float, schema: dict) -> bool:
    """minimum / maximum, with exclusiveMinimum / exclusiveMaximum as numbers or draft 4's booleans."""
    low, high = schema.get("minimum"), schema.get("maximum")
    low_exclusive, high_exclusive = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if low is not None and (value <= low if low_exclusive is True else value < low):
        return False
    if high is not None and (value >= high if high_exclusive is True else value > high):
        return False
    if not isinstance(low_exclusive, bool | None) and value <= low_exclusive:
        return False
    return isinstance(high_exclusive, bool | None) or value < high_exclusive


def _has_format(value: str, name: object) -> bool:
    """The enforced formats, checked by Python's own parsers (29 February taken in any year)."""
    try:
        if name == "date":
            day = value[:5] + "02-28" if value[4:] == "-02-29" else value
            return len(value) == 10 and bool(datetime.date.fromisoformat(day))
        if name in ("time", "date-time"):
            if name == "date-time" and not (len(value) > 10 and value[10] == "T"
                                            and _has_format(value[:10], "date")):
                return False
            clock = value[11:] if name == "date-time" else value
            return len(clock) >= 8 and clock[2] == ":" and bool(datetime.time.fromisoformat(clock))
        if name == "uuid":
            return len(value) == 36 and bool(uuid.UUID(value))
        if name == "ipv4":
            return bool(ipaddress.IPv4Address(value))
        if name == "email":
            local, _, domain = value.partition("@")
            return bool(local) and "." in domain and all(domain.split("."))
    except ValueError:
        return False
    return True  # not an enforced format: an annotation
