"""The sampling fields of a completions or chat body -> SamplingParams: the sampler's settings by
their own names (the checkpoint's generation defaults for what a body leaves out), stop strings and
stop token ids, logit_bias, min_tokens and the rest of vLLM's; errors name the client's field."""

from __future__ import annotations

import numpy as np

from api.body_fields import BodyFields, describe, is_token_id
from api.errors import invalid
from core.generation_defaults import GenerationDefaults
from core.sampling_params import SAMPLING_COLUMNS, SamplingParams, SamplingParamsError

MAX_STOP_STRINGS = 64
# The sampler's settings a body sets under their own names (logprobs has fields of its own).
KNOBS = tuple(c for c in SAMPLING_COLUMNS if c.name in SamplingParams.__dataclass_fields__)
SAMPLING_FIELDS = frozenset({
    "max_tokens", "stop", "stop_token_ids", "ignore_eos", "min_tokens", "logit_bias",
    "include_stop_str_in_output", "truncate_prompt_tokens", *(c.name for c in KNOBS),
})


def _parse_stop(fields: BodyFields) -> tuple[str, ...]:
    stop = fields.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list):
        raise invalid("stop", f"'stop' must be a non-empty string or an array of them, got {describe(stop)}")
    for i, s in enumerate(stops):
        if not isinstance(s, str) or not s:
            raise invalid("stop", f"'stop[{i}]' must be a non-empty string, got {describe(s)}")
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid("stop", f"'stop' has {len(stops)} strings; at most {MAX_STOP_STRINGS} are allowed")
    return tuple(stops)


def _parse_stop_token_ids(fields: BodyFields) -> tuple[int, ...]:
    ids = fields.get("stop_token_ids")
    if ids is None:
        return ()
    if not isinstance(ids, list) or not all(is_token_id(t) for t in ids):
        raise invalid("stop_token_ids", "'stop_token_ids' must be an array of non-negative integer token "
                      f"ids, got {describe(ids)}")
    return tuple(ids)


def sampling_params(fields: BodyFields, defaults: GenerationDefaults, max_tokens: int | None, max_field: str,
                    logprobs: int | None, logprobs_field: str,
                    prompt_logprobs: int | None = None, structured_output: str = "") -> SamplingParams:
    """The request's SamplingParams (max_tokens None: up to the context); SamplingParams checks the
    ranges, errors keep the client's names."""
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            **{c.name: _knob(fields, c.name, c.dtype, defaults) for c in KNOBS},
            stop=_parse_stop(fields),
            stop_token_ids=_parse_stop_token_ids(fields),
            ignore_eos=fields.bool("ignore_eos", False),
            min_tokens=fields.int("min_tokens", None, None, default=0),  # type: ignore[arg-type]
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            logit_bias=_parse_logit_bias(fields),
            include_stop_str_in_output=fields.bool("include_stop_str_in_output", False),
            truncate_prompt_tokens=fields.int("truncate_prompt_tokens", None, None),
            structured_output=structured_output,
        )
    except SamplingParamsError as e:
        param = {"max_tokens": max_field, "logprobs": logprobs_field}.get(e.field, e.field)
        message = str(e).removeprefix(f"{e.field}: ")
        raise invalid(param, f"'{param}' {message}") from None


def _parse_logit_bias(fields: BodyFields) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias`: {"token id": bias}; SamplingParams checks the ranges."""
    value = fields.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise invalid("logit_bias", "'logit_bias' must be an object of token ids to biases, got "
                      f"{describe(value)}")
    pairs = []
    for key, bias in value.items():
        if not key.isdigit():
            raise invalid("logit_bias", "'logit_bias' keys must be token ids (non-negative integers), "
                          f"got {key!r}")
        if not isinstance(bias, int | float) or isinstance(bias, bool):
            raise invalid("logit_bias", f"'logit_bias[{key}]' must be a number, got {describe(bias)}")
        pairs.append((int(key), float(bias)))
    return tuple(pairs)


def _knob(fields: BodyFields, name: str, dtype: type, defaults: GenerationDefaults) -> float | int | None:
    """One sampler setting: the body's value, else the checkpoint's generation default where it has
    one, else SamplingParams' own."""
    default = getattr(defaults, name, SamplingParams.__dataclass_fields__[name].default)
    if np.dtype(dtype).kind == "f":
        return fields.float(name, default)
    return fields.int(name, None, None, default=default)  # type: ignore[arg-type]
