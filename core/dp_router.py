"""The DP router: which replica takes a new request.

A replica's cost for a request is the work it already has (tokens routed to it and not yet
finished: prompt plus max_tokens of each) plus the prompt tokens it would have to compute, i.e.
the prompt minus the prefix its radix tree already holds. The cheapest live replica wins; ties
rotate, so a burst of identical requests spreads evenly instead of piling onto replica 0
(sglang#1417). Counting tokens rather than requests keeps one long prompt from looking as cheap
as one short one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class DPRouter:
    def __init__(self, num_replicas: int) -> None:
        self.load_tokens = [0] * num_replicas  # routed and unfinished work per replica
        self._routed: dict[str, tuple[int, int]] = {}  # request id -> (replica, cost)
        self._next_tie = 0

    def pick(self, live: Sequence[int], prompt_len: int, max_tokens: int,
             cached_prefix_len: Callable[[int], int]) -> int | None:
        """The replica for a request, or None when no replica is alive.

        `cached_prefix_len(replica)` is how many prompt tokens that replica's prefix cache holds.
        """
        if not live:
            return None
        costs = [(self.load_tokens[r] + prompt_len - cached_prefix_len(r), r) for r in live]
        best = min(cost for cost, _ in costs)
        tied = [r for cost, r in costs if cost == best]
        choice = tied[self._next_tie % len(tied)]
        self._next_tie += 1
        del max_tokens  # part of the load once assigned, the same for every candidate
        return choice

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

    def num_routed(self, replica: int) -> int:
        return sum(1 for r, _ in self._routed.values() if r == replica)
