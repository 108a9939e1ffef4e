"""RoPE scaling as a checkpoint's config.json asks for it: none, or YaRN.

Qwen3 is trained to 32,768 tokens and documents YaRN for longer contexts (up to 131,072 with
factor 4): config.json's `rope_scaling` (or `rope_parameters`, as transformers 5 writes it)
`{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}`. YaRN changes
only the rotary tables (core/execution/model/yarn.py computes them, as transformers does), so the
kernels are the same. A scaled model's context is `original_max_position_embeddings x factor`, or
`max_position_embeddings` where that is larger. Other scaling types are refused at start, naming
the field; none is silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class RopeScalingError(ValueError):
    """A config's rope scaling that Cadence cannot compute; the message names the field."""


@dataclass(frozen=True)
class YarnScaling:
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None  # None: derived from factor (and mscale, mscale_all_dim)
    truncate: bool = True

    @property
    def max_positions(self) -> int:
        return int(self.original_max_position_embeddings * self.factor)


def read_rope_scaling(hf: dict[str, Any], where: str) -> YarnScaling | None:
    """The YaRN scaling a config.json asks for, None for plain RoPE; RopeScalingError otherwise."""
    name = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    fields = hf.get(name) or {}
    if not isinstance(fields, dict):
        raise RopeScalingError(f"{where}: {name} must be an object, got {fields!r}")
    rope_type = fields.get("rope_type", fields.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type != "yarn":
        raise RopeScalingError(f"{where}: {name}.rope_type {rope_type!r} is not supported: Cadence computes "
                               "'default' and 'yarn' (Qwen3's long-context scaling)")
    original = fields.get("original_max_position_embeddings", hf.get("max_position_embeddings"))
    if not isinstance(original, int) or isinstance(original, bool) or original < 1:
        raise RopeScalingError(f"{where}: {name}.original_max_position_embeddings must be a positive "
                               f"integer, got {original!r}")
    factor = fields.get("factor")
    if factor is None and isinstance(hf.get("max_position_embeddings"), int):
        factor = hf["max_position_embeddings"] / original  # as transformers derives it
    if not isinstance(factor, int | float) or isinstance(factor, bool) or factor < 1:
        raise RopeScalingError(f"{where}: {name}.factor must be a number >= 1, got {factor!r}")
    numbers = {}
    for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor"):
        value = fields.get(key)
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise RopeScalingError(f"{where}: {name}.{key} must be a number, got {value!r}")
        if value is not None:
            numbers[key] = float(value)
    truncate = fields.get("truncate", True)
    if not isinstance(truncate, bool):
        raise RopeScalingError(f"{where}: {name}.truncate must be true or false, got {truncate!r}")
    return YarnScaling(float(factor), original, truncate=truncate, **numbers)
