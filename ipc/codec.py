"""Envelopes on the wire: frozen dataclasses to and from orjson bytes, never pickle.

A message type is a frozen dataclass registered with `@message` (under its class name, or a name
given as `@message("name")`). `encode` writes `{"type": name, "body": {fields}}`; `decode` looks the
name up, checks the body against the field annotations and rebuilds the dataclass, including nested
dataclasses and tuples. Every problem with received bytes (not JSON, unknown type, missing or extra
field, wrong type, a `__post_init__` that rejects the values) raises `CodecError` naming the type and
the field path, e.g. "message Batch field 'items[2].token_ids[0]': expected int, got str 'x'".

Supported annotations: int, float (an int is accepted and widened), bool, str, None, Any, enums,
`X | None` and other unions (members tried in order), `tuple[X, ...]`, `tuple[X, Y]`, `list[X]`,
`dict[str, X]`, and dataclasses (registered or not) nested in any of these. Numpy arrays and numpy
scalars in an encoded message are written as (nested) lists and numbers, and decode as plain lists
and numbers: annotate such a field `list[int]` or `list[float]`. A field annotated `np.ndarray` is
refused, because the dtype would not survive; tensors travel through shared memory, not envelopes.

Fields with a default may be missing from a body (so a newer sender can drop one), fields without
one may not; unknown fields are always an error. Called by ipc/channels.py and by tests.

One bad item never takes the others down. A CodecError carries `names`: the identifying scalars
(request_id, replica, rank, step_id) found at the top of the body that failed, so a receiver can
fail exactly the request or step it names. A list field declared with `items_fail_alone(into, by)`
keeps its good items when some fail: each bad one is left out and described by an `InvalidItem`
(its index, the item's own `by` field when readable, the error) in the field `into`, and the
message decodes. TokenDeltas uses it, so one malformed output fails one stream, not all of them.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any

import orjson

_ENCODE_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_ENVELOPE_KEYS = frozenset({"type", "body"})


# Top-level body fields that name what a message is about; a CodecError reports those it can read.
_NAMING_FIELDS = ("request_id", "query_id", "replica", "rank", "step_id")


class CodecError(ValueError):
    """Bytes that are not a valid envelope of a registered message type, or a message that cannot be
    encoded. The message names the type and field; `type_name` and `names` (request_id, query_id,
    replica, rank, step_id: whichever the body held as plain scalars) say whom the bad message was about."""

    def __init__(self, message: str, type_name: str | None = None,
                 names: dict[str, str | int] | None = None) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.names = dict(names or {})


@dataclasses.dataclass(frozen=True)
class InvalidItem:
    """An item left out of a list declared with `items_fail_alone`, and why."""

    index: int  # its place in the list as sent
    key: str | int | None  # the item's own `by` field (its request id), None when unreadable
    error: str


_ITEMS_FAIL_ALONE = "cadence.codec.items_fail_alone"


def items_fail_alone(into: str, by: str) -> dict[str, Any]:
    """Field metadata: decode this list item by item, leaving bad items out and reporting each as
    an InvalidItem in the field `into` (annotated `list[InvalidItem]`, default empty); `by` is the
    item field that names it. Use it as `field(metadata=items_fail_alone("invalid", "request_id"))`."""
    return {_ITEMS_FAIL_ALONE: (into, by)}


_TYPES_BY_NAME: dict[str, type] = {}
_NAMES_BY_TYPE: dict[type, str] = {}
# Resolved field annotations per dataclass, filled on first use so forward references work.
_HINTS: dict[type, dict[str, Any]] = {}
# Per dataclass: its items_fail_alone list fields, {field: (into, by)}.
_SALVAGED: dict[type, dict[str, tuple[str, str]]] = {}

_T = typing.TypeVar("_T", bound=type)


def message(name_or_cls: str | _T | None = None) -> Any:
    """Register a frozen dataclass as a message type: `@message` or `@message("name")`."""

    def register(cls: _T, name: str) -> _T:
        if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            raise TypeError(f"message {name}: {cls.__qualname__} must be a frozen dataclass")
        if any(not f.init for f in dataclasses.fields(cls)):
            raise TypeError(f"message {name}: fields with init=False cannot be decoded")
        existing = _TYPES_BY_NAME.get(name)
        if existing is not None and existing is not cls:
            raise TypeError(f"message type name {name!r} is already registered by {existing.__qualname__}")
        _TYPES_BY_NAME[name] = cls
        _NAMES_BY_TYPE[cls] = name
        return cls

    if isinstance(name_or_cls, type):
        return register(name_or_cls, name_or_cls.__name__)
    return lambda cls: register(cls, name_or_cls or cls.__name__)


def message_type(name: str) -> type | None:
    """The dataclass registered under `name`, or None."""
    return _TYPES_BY_NAME.get(name)


def type_name(msg_or_cls: object) -> str:
    cls = msg_or_cls if isinstance(msg_or_cls, type) else type(msg_or_cls)
    name = _NAMES_BY_TYPE.get(cls)
    if name is None:
        raise CodecError(f"{cls.__qualname__} is not a registered message type (decorate it with @message)")
    return name


def encode(msg: object) -> bytes:
    """Serialize a registered message as a JSON envelope."""
    name = type_name(msg)
    try:
        return orjson.dumps({"type": name, "body": msg}, option=_ENCODE_OPTIONS)
    except TypeError as e:  # orjson.JSONEncodeError is a TypeError
        raise CodecError(f"message {name} cannot be encoded: {e}") from e


def decode(data: bytes | bytearray | memoryview) -> Any:
    """Rebuild the message in a JSON envelope, checking every field against its annotation."""
    try:
        envelope = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise CodecError(f"malformed envelope: not valid JSON ({e}); starts with {bytes(data[:40])!r}") from e
    if not isinstance(envelope, dict) or set(envelope) != _ENVELOPE_KEYS:
        shown = sorted(envelope) if isinstance(envelope, dict) else type(envelope).__name__
        raise CodecError(f"malformed envelope: expected an object with keys 'type' and 'body', got {shown}")
    name = envelope["type"]
    cls = _TYPES_BY_NAME.get(name) if isinstance(name, str) else None
    if cls is None:
        raise CodecError(f"unknown message type {name!r}", None, _names(envelope["body"]))
    try:
        return _build(cls, envelope["body"], name, "")
    except CodecError as e:
        raise CodecError(str(e), name, _names(envelope["body"])) from None


def _names(body: Any) -> dict[str, str | int]:
    if not isinstance(body, dict):
        return {}
    return {k: body[k] for k in _NAMING_FIELDS
            if isinstance(body.get(k), str | int) and not isinstance(body.get(k), bool)}


# --- decoding ------------------------------------------------------------------------------------


def _hints(cls: type, context: str) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        try:
            all_hints = typing.get_type_hints(cls)
        except NameError as e:
            raise TypeError(f"{context}: cannot resolve the annotations of {cls.__qualname__}: {e}") from e
        hints = {f.name: all_hints[f.name] for f in dataclasses.fields(cls)}
        for field_name, tp in hints.items():
            _check_supported(tp, f"{context} field {field_name!r}")
        _HINTS[cls] = hints
    return hints


def _check_supported(tp: Any, where: str) -> None:
    origin = typing.get_origin(tp)
    if origin is None:
        ok = (
            tp in _SCALARS
            or tp is Any
            or tp is type(None)
            or tp in (tuple, list, dict)
            or (isinstance(tp, type) and (issubclass(tp, enum.Enum) or dataclasses.is_dataclass(tp)))
        )
        if not ok:
            hint = " (tensors go through shared memory; use list[int] here)" if _is_ndarray(tp) else ""
            raise TypeError(f"{where}: unsupported annotation {tp!r}{hint}")
        return
    if origin is dict and typing.get_args(tp) and typing.get_args(tp)[0] is not str:
        raise TypeError(f"{where}: dict keys must be str, got {tp!r}")
    if origin not in (tuple, list, dict, typing.Union, types.UnionType):
        raise TypeError(f"{where}: unsupported annotation {tp!r}")
    for arg in typing.get_args(tp):
        if arg is not Ellipsis:
            _check_supported(arg, where)


def _is_ndarray(tp: Any) -> bool:
    return getattr(tp, "__module__", "") == "numpy" and getattr(tp, "__name__", "") == "ndarray"


def _build(cls: type, body: Any, name: str, path: str) -> Any:
    where = f"message {name}" + (f" field {path!r}" if path else "")
    if not isinstance(body, dict):
        raise CodecError(f"{where}: expected an object for {cls.__qualname__}, got {_describe(body)}")
    hints = _hints(cls, f"message {name}")
    extra = sorted(set(body) - set(hints))
    if extra:
        raise CodecError(f"{where}: unknown field(s) {', '.join(map(repr, extra))} for {cls.__qualname__}")
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [n for n in required if n not in body]
    if missing:
        prefix = f"{path}." if path else ""
        raise CodecError(f"message {name}: missing field(s) {', '.join(repr(prefix + n) for n in missing)}")
    prefix = f"{path}." if path else ""
    salvaged = _SALVAGED.get(cls)
    if salvaged is None:
        salvaged = _SALVAGED[cls] = {f.name: f.metadata[_ITEMS_FAIL_ALONE] for f in dataclasses.fields(cls)
                                     if _ITEMS_FAIL_ALONE in f.metadata}
    kwargs = {k: _convert(v, hints[k], name, prefix + k) for k, v in body.items() if k not in salvaged}
    for field_name, (into, by) in salvaged.items():
        if field_name in body:
            kwargs[field_name], invalid = _convert_salvaging(body[field_name], hints[field_name], name,
                                                             prefix + field_name, by)
            kwargs[into] = [*kwargs.get(into, ()), *invalid]
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise CodecError(f"{where}: {cls.__qualname__} rejected the values: {e}") from e


def _convert(value: Any, tp: Any, name: str, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is None:
        converter = _SCALARS.get(tp)
        if converter is not None:
            return converter(value, name, path)
        if tp is Any:
            return value
        if tp is type(None):
            return _expect(value is None, value, "null", name, path, None)
        if tp in (tuple, list, dict):
            return _convert(
                value, tp[Any, ...] if tp is tuple else tp[Any] if tp is list else dict[str, Any], name, path
            )
        if issubclass(tp, enum.Enum):
            try:
                return tp(value)
            except ValueError:
                allowed = ", ".join(repr(m.value) for m in tp)
                raise CodecError(
                    f"message {name} field {path!r}: {value!r} is not a {tp.__name__} (one of {allowed})"
                ) from None
        return _build(tp, value, name, path)  # a dataclass, checked by _check_supported
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, name, path)
            except CodecError as e:
                errors.append(str(e))
        if len(errors) == 1:
            raise CodecError(errors[0])
        raise CodecError(f"message {name} field {path!r}: expected {_type_str(tp)}, got {_describe(value)}")
    if origin is dict:
        _expect(isinstance(value, dict), value, "an object", name, path, None)
        value_tp = args[1] if args else Any
        return {k: _convert(v, value_tp, name, f"{path}[{k!r}]") for k, v in value.items()}
    _expect(isinstance(value, list), value, "an array", name, path, None)
    if origin is list:
        return _convert_items(value, args[0] if args else Any, name, path)
    # tuple: tuple[X, ...] or a fixed tuple[X, Y]
    if not args or (len(args) == 2 and args[1] is Ellipsis):
        return tuple(_convert_items(value, args[0] if args else Any, name, path))
    if args == ((),):  # tuple[()]
        args = ()
    if len(value) != len(args):
        raise CodecError(
            f"message {name} field {path!r}: expected {len(args)} items for {_type_str(tp)}, got {len(value)}"
        )
    return tuple(_convert(v, a, name, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))


def _convert_salvaging(value: Any, tp: Any, name: str, path: str, by: str) -> tuple[list, list[InvalidItem]]:
    """A list whose bad items are left out: (the good items, an InvalidItem per bad one)."""
    _expect(isinstance(value, list), value, "an array", name, path, None)
    item_tp = typing.get_args(tp)[0]
    good, invalid = [], []
    for i, item in enumerate(value):
        try:
            good.append(_convert(item, item_tp, name, f"{path}[{i}]"))
        except CodecError as e:
            key = item.get(by) if isinstance(item, dict) else None
            readable = isinstance(key, str | int) and not isinstance(key, bool)
            invalid.append(InvalidItem(i, key if readable else None, str(e)))
    return good, invalid


def _convert_items(value: list, item_tp: Any, name: str, path: str) -> list:
    """The items of a JSON array as `item_tp`. An array of one exact scalar type (token ids, say) is
    checked in one pass and kept as it is; only a mixed one goes item by item, for the error's path."""
    if item_tp is Any:
        return value
    exact = _EXACT_ITEM_TYPES.get(item_tp)
    if exact is not None and list(map(type, value)).count(exact) == len(value):
        return value
    return [_convert(v, item_tp, name, f"{path}[{i}]") for i, v in enumerate(value)]


def _expect(ok: bool, value: Any, expected: str, name: str, path: str, result: Any) -> Any:
    if not ok:
        raise CodecError(f"message {name} field {path!r}: expected {expected}, got {_describe(value)}")
    return result


def _int(value: Any, name: str, path: str) -> int:
    return _expect(isinstance(value, int) and not isinstance(value, bool), value, "int", name, path, value)


def _float(value: Any, name: str, path: str) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return _expect(ok, value, "float", name, path, float(value) if ok else None)


def _bool(value: Any, name: str, path: str) -> bool:
    return _expect(isinstance(value, bool), value, "bool", name, path, value)


def _str(value: Any, name: str, path: str) -> str:
    return _expect(isinstance(value, str), value, "str", name, path, value)


_SCALARS: dict[Any, Callable[[Any, str, str], Any]] = {int: _int, float: _float, bool: _bool, str: _str}
# Items that need no conversion when their type is exactly this (an int is no bool, a float no int).
_EXACT_ITEM_TYPES: dict[Any, type] = {int: int, float: float, bool: bool, str: str}


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{type(value).__name__} {shown}"


def _type_str(tp: Any) -> str:
    return getattr(tp, "__name__", None) if typing.get_origin(tp) is None else str(tp).replace("typing.", "")
