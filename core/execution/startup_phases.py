"""The phases of a runner's start-up, each logged when it starts and when it is done, with its time.

Loading a 14B checkpoint, profiling memory, compiling the Triton kernels and capturing the decode
CUDA graphs take minutes together; without a word between the command and "serving" a user cannot
tell a slow start from a hung one. ModelRunner runs each phase in `StartupPhases.phase`, which logs
"loading weights ..." and then "loading weights: done in 41.2 s" (logger `cadence.startup`) when
the runner shows progress: rank 0 of each replica in the server, so a DP=4 start logs each phase
four times and a TP=4 one once. The lines suit a terminal and a log file alike; on a terminal the
loader's bar (tqdm) also shows the tensors of the checkpoint as they load.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

log = logging.getLogger("cadence.startup")


class StartupPhases:
    """Logs the phases of one start-up, or nothing when not `enabled`."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Log `name ...`, run the block, log `name: done in X s` (not when the block raises: its
        error says what happened)."""
        if not self.enabled:
            yield
            return
        log.info("%s ...", name)
        start = time.perf_counter()
        yield
        log.info("%s: done in %.1f s", name, time.perf_counter() - start)
