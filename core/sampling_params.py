"""SamplingParams: how one request wants its tokens chosen and when it stops.

Built by the API layer from a request body (fields the client left out already filled from the
model's generation defaults), validated here so every entry point gets the same messages.
`max_tokens` None means "up to the context": the tokenizer process, which counts the prompt's
tokens, fills in max_model_len minus the prompt before the request goes on to the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_LOGPROBS = 20


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
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            fail("logprobs", f"must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if self.max_tokens is None and self.min_tokens < 0:
            fail("min_tokens", f"must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and not 0 <= self.min_tokens <= self.max_tokens:
            fail("min_tokens", f"must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            fail("stop", "every stop string must be a non-empty string")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            fail("stop_token_ids", "every stop token id must be a non-negative integer")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)
