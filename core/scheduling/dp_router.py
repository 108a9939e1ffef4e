"""The DP router: which replica takes a new request.

A request's work on a replica is the tokens that replica would compute for it: the prompt minus
the prefix its radix tree already holds, plus max_tokens. A replica's load is the work of the
requests routed to it and not yet finished. The replica with the least load + work wins; ties
rotate, so a burst of identical requests spreads evenly instead of piling onto replica 0
(sglang#1417). Counting tokens rather than requests keeps one long prompt from looking as cheap as
one short one, and counting only uncached tokens sends a group of requests that share a long
prefix to the replica that holds it, until the load there outweighs what the cache saves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class DPRouter:
    def __init__(self, num_replicas: int) -> None:
        self.load_tokens = [0] * num_replicas  # routed and unfinished work per replica
        self._routed: dict[str, tuple[int, int]] = {}  # request id -> (replica, cost)
        self._next_tie = 0

    def pick(self, live: Sequence[int], prompt_len: int, max_tokens: int,
             cached_prefix_len: Callable[[int], int]) -> tuple[int, int] | None:
        """(replica, work) for a request, or None when no replica is alive.

        `cached_prefix_len(replica)` is how many prompt tokens that replica's prefix cache holds.
        """
        if not live:
            return None
        work = {r: prompt_len - cached_prefix_len(r) + max_tokens for r in live}
        best = min(self.load_tokens[r] + work[r] for r in live)
        tied = [r for r in live if self.load_tokens[r] + work[r] == best]
        choice = tied[self._next_tie % len(tied)]
        self._next_tie += 1
        return choice, work[choice]

    def assign(self, request_id: str, replica: int, cost: int) -> None:
        self.release(request_id)
        self._routed[request_id] = (replica, cost)
        self.load_tokens[replica] += cost

    def release(self, request_id: str) -> int | None:
        """Forget a finished request; returns the replica it was on, if it was routed."""
        routed = self._routed.pop(request_id, None)
        if routed is None:
            return None
        replica, cost = routed
        self.load_tokens[replica] -= cost
        return replica

    def replica_of(self, request_id: str) -> int | None:
        routed = self._routed.get(request_id)
        return None if routed is None else routed[0]
