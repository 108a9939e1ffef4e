"""RoutedPrefixes: the DP router's record of the prompts it sent to each replica that have not finished.

A replica's radix tree only learns a prompt's pages once a step has written their KV. In a burst
the prompts of a group that share a long prefix all arrive before that, so a router that weighs
only cached prefixes sees nothing in common between them and spreads the group over every
replica: each replica then computes the prefix once. This record fills that gap, as gateway
routers do with their tree of routed request text (SGLang's cache-aware policy): what was routed
to a replica will be in its cache a step later, so it counts as a prefix there already.

A prompt is recorded as the keys of its prefixes at every `chunk_tokens` (a multiple of the page
size): key i stands for tokens [0, (i + 1) * chunk_tokens). A key is a weighted sum of the tokens
modulo 2^64, with weights drawn once from a fixed seed that depend on the token's position, so it
takes a few numpy passes per prompt. A collision only misroutes a request; the caches stay exact.
Chunks of 64 tokens rather than pages keep the dict work per request small; the router then sees a
routed prefix up to 63 tokens shorter than it is, which moves no decision that matters.

Each replica counts, per key, the unfinished requests holding it; a request's keys leave when it
finishes (its pages are in the replica's cache by then, which the router asks directly), and a
dead replica's record goes at once, so the record never outgrows the prompts in flight. Every
prefix of a recorded prompt is recorded too, so the keys a replica holds of a new prompt are a
leading run, found by bisection: a handful of dict lookups per replica, whatever the length.
"""


from __future__ import annotations

import numpy as np

_SEED = 0x5EED_CAFE
_MIN_CHUNK_TOKENS = 64


def chunk_tokens_for(block_size: int) -> int:
    """The record's granularity: whole pages, at least _MIN_CHUNK_TOKENS tokens."""
    return block_size * max(1, _MIN_CHUNK_TOKENS // block_size)


class PrefixKeys:
    """The keys of a prompt's prefixes at every `chunk_tokens` tokens."""

    def __init__(self, chunk_tokens: int) -> None:
        self.chunk_tokens = chunk_tokens
        rng = np.random.default_rng(_SEED)
        self._token_weights = rng.integers(1, 2**63, chunk_tokens, np.int64)  # by place in a chunk
        self._token_weights_sum = self._token_weights.sum()
        self._chunk_weights = np.zeros(0, np.int64)  # by chunk, grown as longer prompts come
        self._rng = rng

    def __call__(self, token_ids: np.ndarray) -> list[int]:
        num_chunks = len(token_ids) // self.chunk_tokens
        if num_chunks == 0:
            return []
        if num_chunks > len(self._chunk_weights):
            grown = self._rng.integers(1, 2**63, num_chunks - len(self._chunk_weights), np.int64)
            self._chunk_weights = np.concatenate([self._chunk_weights, grown])
        tokens = np.asarray(token_ids[: num_chunks * self.chunk_tokens])
        tokens = tokens.reshape(num_chunks, self.chunk_tokens)
        # Every product and sum wraps modulo 2^64, as meant. Adding the weights' sum weighs token + 1
        # rather than token, so a token 0 still counts: 64 zeros and 128 zeros are different prefixes.
        chunk_sums = tokens @ self._token_weights + self._token_weights_sum  # [num_chunks]
        chunk_sums *= self._chunk_weights[:num_chunks]
        return chunk_sums.cumsum().tolist()


class RoutedPrefixes:
    """Per replica, the prefix keys of the unfinished requests routed there, counted."""

    def __init__(self, num_replicas: int) -> None:
        self._counts: list[dict[int, int]] = [{} for _ in range(num_replicas)]
        self._forgotten: set[int] = set()

    def matched_chunks(self, replica: int, keys: list[int]) -> int:
        """How many leading chunks of a prompt (given by its keys) the replica has been sent."""
        counts = self._counts[replica]
        if not keys or keys[0] not in counts:
            return 0
        low, high = 1, len(keys)  # keys[:low] are held; bisect for the longest held run
        while low < high:
            middle = (low + high + 1) // 2
            if keys[middle - 1] in counts:
                low = middle
            else:
                high = middle - 1
        return low

    def add(self, replica: int, keys: list[int]) -> None:
        if replica in self._forgotten:
            raise ValueError(f"replica {replica} is down: nothing can be routed there")
        counts = self._counts[replica]
        for key in keys:
            counts[key] = counts.get(key, 0) + 1

    def remove(self, replica: int, keys: list[int]) -> None:
        if replica in self._forgotten:
            return  # its record went when it died
        counts = self._counts[replica]
        for key in keys:
            left = counts[key] - 1
            if left:
                counts[key] = left
            else:
                del counts[key]

    def forget(self, replica: int) -> None:
        """A replica that died: nothing routed there will ever be cached there."""
        self._forgotten.add(replica)
        self._counts[replica] = {}

    def num_keys(self, replica: int) -> int:
        return len(self._counts[replica])
