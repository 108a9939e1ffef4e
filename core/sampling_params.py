"""SamplingParams: how one request wants its tokens chosen and when it stops; SAMPLING_COLUMNS: how
the part the sampler reads travels to the executor.

SamplingParams is built by the API layer from a request body (fields the client left out already
filled from the model's generation defaults), validated here so every entry point gets the same
messages. `max_tokens` None means "up to the context": the tokenizer process, which counts the
prompt's tokens, fills in max_model_len minus the prompt before the request goes on to the
scheduler. SAMPLING_COLUMNS is the one list of the per-request settings the sampler reads: the dtype
of StepPlan.sampling, the scheduler's slot rows and the plan's packed layout all derive from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from core.structured.grammar import GrammarError, compile_spec

# The most top logprobs a request may ask for unless the server allows more (`--max-logprobs`, as
# vLLM's; OpenAI's chat API allows 20). The engine's own limit is SchedulerConfig.max_logprobs.
DEFAULT_MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024  # tokens one request may bias


class SamplingParamsError(ValueError):
    """A sampling field out of range; `field` names it for the API's error object."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = 16  # None: up to the context, filled in by the tokenizer process
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = the whole vocabulary
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # None = none; 0 = the sampled token's only; N = and the top N
    # None = none; 0 = each prompt token's own logprob (the first has none); N = and the top N
    prompt_logprobs: int | None = None
    # (token id, bias) pairs added to those tokens' logits before the penalties and the draw; logprobs
    # stay the raw model's (OpenAI's logit_bias; ids unique, biases in [-100, 100])
    logit_bias: tuple[tuple[int, float], ...] = ()
    include_stop_str_in_output: bool = False  # vLLM's: the stop string that ended the text stays in it
    # vLLM's: keep only the prompt's last N tokens (left truncation); -1 = the last max_model_len - 1
    truncate_prompt_tokens: int | None = None
    # What the output must be (JSON mode, a JSON schema, tool calls): the spec string of
    # core/structured/grammar.py, "" for free text. The API builds it from response_format and
    # tool_choice; core/structured/specs.py builds it for native clients.
    structured_output: str = ""

    def __post_init__(self) -> None:
        def fail(field: str, message: str) -> None:
            raise SamplingParamsError(field, f"{field}: {message}")

        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            fail("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if not 0.0 <= self.temperature <= 100.0:
            fail("temperature", f"must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            fail("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            fail("top_k", f"must be -1 or 0 (no limit) or positive, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            fail("min_p", f"must be in [0, 1], got {self.min_p}")
        if not 0.0 < self.repetition_penalty <= 10.0:
            fail("repetition_penalty", f"must be in (0, 10], got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                fail(name, f"must be in [-2, 2], got {getattr(self, name)}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            fail("seed", f"must fit in 64 bits, got {self.seed}")
        if self.logprobs is not None and self.logprobs < 0:
            fail("logprobs", f"must be >= 0, got {self.logprobs}")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            fail("prompt_logprobs", f"must be >= 0, got {self.prompt_logprobs}")
        if self.max_tokens is None and self.min_tokens < 0:
            fail("min_tokens", f"must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and not 0 <= self.min_tokens <= self.max_tokens:
            fail("min_tokens", f"must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            fail("stop", "every stop string must be a non-empty string")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            fail("stop_token_ids", "every stop token id must be a non-negative integer")
        if self.truncate_prompt_tokens is not None and not (self.truncate_prompt_tokens == -1
                                                            or self.truncate_prompt_tokens >= 1):
            fail("truncate_prompt_tokens", f"must be -1 or >= 1, got {self.truncate_prompt_tokens}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            fail("logit_bias", f"at most {MAX_LOGIT_BIAS} tokens, got {len(self.logit_bias)}")
        for token_id, bias in self.logit_bias:
            if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
                fail("logit_bias", f"token ids must be non-negative integers, got {token_id!r}")
            if not -100.0 <= bias <= 100.0:  # NaN fails too
                fail("logit_bias", f"the bias of token {token_id} must be in [-100, 100], got {bias}")
        if len({token_id for token_id, _ in self.logit_bias}) != len(self.logit_bias):
            fail("logit_bias", "a token id is given twice")
        if self.structured_output:
            try:
                compile_spec(self.structured_output)
            except GrammarError as e:
                fail("structured_output", str(e))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    @property
    def needs_history(self) -> bool:
        """Whether the sampler reads the request's tokens so far (penalties, structured outputs), so
        every step it samples in carries them, all known."""
        return self.has_penalties or bool(self.structured_output)


class SamplingColumn(NamedTuple):
    """One per-request setting the sampler reads, as it travels in StepPlan.sampling."""

    name: str
    dtype: type  # a numpy scalar type
    value: Callable[[SamplingParams, int], float | int]  # of a request's params and its seed


# Adding a sampling parameter: its field (and check) in SamplingParams, a line here, and in
# core/execution/sampler.py a SamplingTensors field of the same name and the code that reads it. The
# plan's record dtype, the slot table's rows, the packed layout and the host-to-device copy follow.
SAMPLING_COLUMNS = (
    SamplingColumn("temperature", np.float32, lambda params, seed: params.temperature),  # 0 = greedy
    SamplingColumn("top_p", np.float32, lambda params, seed: params.top_p),  # 1 = off
    SamplingColumn("top_k", np.int32, lambda params, seed: max(params.top_k, 0)),  # 0 = off
    SamplingColumn("min_p", np.float32, lambda params, seed: params.min_p),  # 0 = off
    # every request has a seed: its own, or one the scheduler drew at admission
    SamplingColumn("seed", np.int64, lambda params, seed: seed),
    SamplingColumn("repetition_penalty", np.float32, lambda params, seed: params.repetition_penalty),
    SamplingColumn("presence_penalty", np.float32, lambda params, seed: params.presence_penalty),
    SamplingColumn("frequency_penalty", np.float32, lambda params, seed: params.frequency_penalty),
    # -1 = none, 0 = the sampled token's only, N = also the top N
    SamplingColumn("num_logprobs", np.int32,
                   lambda params, seed: -1 if params.logprobs is None else params.logprobs),
)

# One request's settings as one record; aligned, so every column of an array of them is an aligned view.
SAMPLING_DTYPE = np.dtype([(c.name, c.dtype) for c in SAMPLING_COLUMNS], align=True)


def sampling_row(params: SamplingParams, seed: int) -> np.void:
    """The SAMPLING_DTYPE record of a request with `params` and `seed`."""
    return np.array(tuple(c.value(params, seed) for c in SAMPLING_COLUMNS), SAMPLING_DTYPE)[()]


# The settings of a request that asked for nothing: SamplingParams' defaults, seed 0.
DEFAULT_SAMPLING_ROW = sampling_row(SamplingParams(), seed=0)


def sampling_rows(num_reqs: int, **columns) -> np.ndarray:
    """[num_reqs] SAMPLING_DTYPE records at DEFAULT_SAMPLING_ROW, the named `columns` set from a
    scalar or one value per request (for plans built without a scheduler: warm-up steps, tests)."""
    rows = np.full(num_reqs, DEFAULT_SAMPLING_ROW, SAMPLING_DTYPE)
    for name, values in columns.items():
        if name not in SAMPLING_DTYPE.names:
            raise KeyError(f"{name!r} is not a sampling column; the columns are {SAMPLING_DTYPE.names}")
        rows[name] = values
    return rows
