"""Flushing the prefix caches (FlushCache: the REST server's /flush_cache and /reset_prefix_cache).

All live replicas or none: while any of them has a request running or waiting, nothing is flushed
and the answer names who is busy (a flush is for between benchmark runs and after a weights or
cache change, when the server is idle; SGLang refuses a busy flush too). A dead replica's cache is
never used again and is left as it is. The DP router needs no reset: it tracks only unfinished
requests.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ipc.messages import CacheFlushed
from procs.replica import Replica


def flush_caches(replicas: Sequence[Replica], query_id: str, log: logging.Logger) -> CacheFlushed:
    """Empty every live replica's prefix cache, or none of them while any has requests."""
    live = [r for r in replicas if r.alive]
    busy = [reason for r in live if (reason := r.scheduler.busy_reason()) is not None]
    if busy:
        return CacheFlushed(query_id, False, error=f"the prefix cache was not flushed: {'; '.join(busy)}; "
                                                   "flush when no request runs or waits")
    freed = sum(r.scheduler.flush_prefix_cache() for r in live)
    log.info("flushed the prefix cache of %d replica(s): %d pages freed", len(live), freed)
    return CacheFlushed(query_id, True, freed)
