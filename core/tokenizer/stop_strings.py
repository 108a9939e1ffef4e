"""StopStringMatcher: finds a request's stop strings in its streamed text.

The output process feeds each detokenized delta through it and streams only what it returns. A
tail that could still grow into a stop string is held back; when a stop string completes, the
text before it is released and the request stops. As in OpenAI's API and vLLM, the stop string
itself is never emitted. A request that ends for another reason (EOS, max_tokens) calls `flush()`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class StopCheck(NamedTuple):
    text: str  # safe to emit now
    stopped: bool  # a stop string completed; `text` is everything before it


class StopStringMatcher:
    def __init__(self, stop_strings: Iterable[str]) -> None:
        self.stop_strings = tuple(dict.fromkeys(stop_strings))
        for stop in self.stop_strings:
            if not isinstance(stop, str) or not stop:
                raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
        # Invariant: the held-back tail is shorter than the longest stop string and is a proper
        # prefix of at least one of them, so it never holds a whole stop string.
        self._max_held = max((len(s) for s in self.stop_strings), default=1) - 1
        self._held = ""
        self.matched: str | None = None  # the stop string that stopped the request

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def push(self, delta: str) -> StopCheck:
        if self.stopped:
            raise RuntimeError(f"StopStringMatcher.push after stop string {self.matched!r} matched")
        text = self._held + delta
        match = self._earliest_match(text)
        if match is not None:
            start, self.matched = match
            self._held = ""
            return StopCheck(text[:start], stopped=True)
        held_len = self._partial_tail_len(text)
        self._held = text[len(text) - held_len :]
        return StopCheck(text[: len(text) - held_len], stopped=False)

    def flush(self) -> str:
        """The held-back tail, for a request that finished for another reason."""
        held, self._held = self._held, ""
        return held

    def _earliest_match(self, text: str) -> tuple[int, str] | None:
        """(start, stop string) of the match that completes first; the longer one on a tie.

        Ordering by end rather than start makes the result independent of how the text was split
        into deltas: streamed token by token, the first stop string to complete is the one seen.
        The held tail is shorter than the longest stop string, so the search is O(len(delta)).
        """
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self.stop_strings:
            start = text.find(stop)
            if start != -1 and (best is None or (start + len(stop), start) < best[:2]):
                best = (start + len(stop), start, stop)
        return None if best is None else (best[1], best[2])

    def _partial_tail_len(self, text: str) -> int:
        """Length of the longest tail of text that is a proper prefix of some stop string."""
        for length in range(min(len(text), self._max_held), 0, -1):
            tail = text[len(text) - length :]
            if any(stop.startswith(tail) for stop in self.stop_strings):
                return length
        return 0
