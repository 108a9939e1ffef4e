"""The executor's half of core/registry.py: a registered name to its class, imported on first use."""

from __future__ import annotations

import importlib


def registered_class(table: dict, name: str | None, what: str) -> type:
    """The class registered under `name` in `table` (one of core/registry.py's tables); `what`
    names the table in the error, e.g. "attention backend"."""
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}: use one of {', '.join(str(key) for key in table)}")
    module_name, _, class_name = table[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)
