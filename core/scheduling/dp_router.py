"""The DP router: which replica takes a new request.

A request's work on a replica is the tokens that replica would compute for it: the prompt minus
the prefix the replica already has, plus max_tokens. A replica has a prefix when its radix tree
holds it or when the router has sent it an unfinished prompt that starts with it (RoutedPrefixes):
such a prompt's pages join the tree a step later, so the requests of a burst that share a system
prompt follow the first of them instead of each computing it again on another replica. A
replica's load is the work of the requests routed to it and not yet finished.

The replica with the least load + work - shared prefix wins: a shared prefix token counts twice,
once as work the replica need not do and once more because splitting a group is not a one-off:
every later request of the group then has two replicas to choose from, and both keep the prefix.
Weighed once, a burst of 32 groups x 16 prompts on a 2,048-token prefix split 4-15 of its groups
over two replicas (the router alone, requests finishing in order at concurrency 128); weighed
twice, 0-2. Ties rotate, so a burst of identical requests spreads evenly instead of piling onto
replica 0 (sglang#1417). Counting tokens rather than requests keeps one long prompt from looking
as cheap as one short one.

Load is the guard, and it bounds the imbalance: a request goes to replica r only if
load[r] - 2 x shared[r] <= load[s] - 2 x shared[s] for every live s, so right after it, load[r]
exceeds any other load by at most prompt + max_tokens + shared[r] <= 2 x prompt + max_tokens.
Arrivals alone never make the most and least loaded replicas differ by more than that of the
largest request routed (finishing requests change loads as they come).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from core.scheduling.routed_prefixes import PrefixKeys, RoutedPrefixes, chunk_tokens_for


class Route(NamedTuple):
    replica: int
    work: int  # tokens the replica computes for the request: unshared prompt + tokens to generate
    cached_len: int  # prompt tokens the replica's prefix cache held when routed
    prefix_keys: list[int]  # the prompt's prefixes (RoutedPrefixes), recorded for the replica on assign()


class DPRouter:
    def __init__(self, num_replicas: int, block_size: int) -> None:
        self.load_tokens = [0] * num_replicas  # routed and unfinished work per replica
        self.routed_prefixes = RoutedPrefixes(num_replicas)
        self._prefix_keys = PrefixKeys(chunk_tokens_for(block_size))
        self._routed: dict[str, Route] = {}  # request id -> its route, while unfinished
        self._next_tie = 0

    def pick(self, live: Sequence[int], prompt: np.ndarray, max_tokens: int,
             cached_prefix_len: Callable[[int], int]) -> Route | None:
        """Where a request goes, or None when no replica is alive.

        `cached_prefix_len(replica)` is how many prompt tokens that replica's prefix cache holds.
        """
        if not live:
            return None
        # One live replica has nothing to choose from, now or later (replicas do not come back).
        keys = self._prefix_keys(prompt) if len(live) > 1 else []
        chunk_tokens = self._prefix_keys.chunk_tokens
        prompt_len = len(prompt)
        cached = {r: cached_prefix_len(r) for r in live}
        shared = {r: max(cached[r], self.routed_prefixes.matched_chunks(r, keys) * chunk_tokens)
                  for r in live}
        score = {r: self.load_tokens[r] + prompt_len + max_tokens - 2 * shared[r] for r in live}
        best = min(score.values())
        tied = [r for r in live if score[r] == best]
        choice = tied[self._next_tie % len(tied)]
        self._next_tie += 1
        return Route(choice, prompt_len - shared[choice] + max_tokens, cached[choice], keys)

    def assign(self, request_id: str, route: Route) -> None:
        self.release(request_id)
        self._routed[request_id] = route
        self.load_tokens[route.replica] += route.work
        self.routed_prefixes.add(route.replica, route.prefix_keys)

    def release(self, request_id: str) -> int | None:
        """Forget a finished request; returns the replica it was on, if it was routed."""
        route = self._routed.pop(request_id, None)
        if route is None:
            return None
        self.load_tokens[route.replica] -= route.work
        self.routed_prefixes.remove(route.replica, route.prefix_keys)
        return route.replica

    def forget_replica(self, replica: int) -> None:
        """A replica that died: what was sent there will never be cached there. Its requests are
        released one by one as they move to other replicas."""
        self.routed_prefixes.forget(replica)

    def replica_of(self, request_id: str) -> int | None:
        route = self._routed.get(request_id)
        return None if route is None else route.replica
