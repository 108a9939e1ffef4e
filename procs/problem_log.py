"""ProblemLog: a problem that repeats is logged once, then counted, never flooded.

A bad message on a channel tends to come in floods (a peer with a bug sends the same mistake every
step: 256 lines in two seconds is no help to an operator). The first problem of a kind is logged at
once, in full; repeats of it are counted and summed up in one line per `every_s`, with the latest
one's text, when the next one comes or when the owner's loop calls `flush()`. Used by every process
loop that receives messages, and by the API's clients.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass


@dataclass
class _Kind:
    first_s: float
    summed_s: float  # when the count was last logged
    count: int = 0  # since then
    latest: str = ""


class ProblemLog:
    def __init__(self, log: logging.Logger, every_s: float = 10.0) -> None:
        self.log = log
        self.every_s = every_s
        self._kinds: dict[str, _Kind] = {}
        self.total = 0  # problems reported since start, for tests and status

    def warning(self, kind: str, message: str) -> None:
        """Report one problem of `kind` (say "bad message on channel scheduler outputs")."""
        self.total += 1
        now = time.monotonic()
        seen = self._kinds.get(kind)
        if seen is None:
            self._kinds[kind] = _Kind(now, now)
            self.log.warning("%s: %s (repeats are counted, summed up every %g s)", kind, message,
                             self.every_s)
            return
        seen.count += 1
        seen.latest = message
        self._sum_up(kind, seen, now)

    def flush(self) -> None:
        """Log the counts that are due; cheap enough for every loop turn."""
        if not self._kinds:
            return
        now = time.monotonic()
        for kind, seen in self._kinds.items():
            self._sum_up(kind, seen, now)

    def _sum_up(self, kind: str, seen: _Kind, now: float) -> None:
        if seen.count and now - seen.summed_s >= self.every_s:
            self.log.warning("%s: %d more in the last %.0f s; the latest: %s", kind, seen.count,
                             now - seen.summed_s, seen.latest)
            seen.count, seen.summed_s = 0, now
