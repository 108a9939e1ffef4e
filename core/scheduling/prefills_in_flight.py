"""PrefillsInFlight: the prompts a replica is computing, so that a waiting request that shares more
of its prompt with one of them than the prefix cache holds waits for their pages instead of
computing the same tokens beside them.

The radix tree learns a prompt's pages only once the step that writes them is done. Two prompts of a
group admitted in one step therefore both miss and both compute the shared prefix (the second one's
duplicate pages are dropped when published; the compute is not). With the DP router keeping each
group's prompts on one replica such pairs became the common case: a burst of 16 groups x 16 prompts
on a 512-token system prompt hit 65 % of its prompt tokens with --dp 2 on the CPU against 81 % with
--dp 1 (ideal 88 %). SGLang's scheduler makes a like check within a batch.

Rebuilt by the scheduler every step from its running requests whose prompt is not all computed
(their chunks may be in flight), plus each request it admits in the step. A prompt is recorded as
the keys of its prefixes (routed_prefixes.PrefixKeys, every 64 tokens), computed once per request.
"""

from __future__ import annotations

from collections.abc import Iterable

from core.scheduling.request import Request
from core.scheduling.routed_prefixes import PrefixKeys, RoutedPrefixes, chunk_tokens_for


class PrefillsInFlight:
    def __init__(self, keys_of: PrefixKeys) -> None:
        self._keys_of = keys_of
        self._record = RoutedPrefixes(1)

    @classmethod
    def of(cls, running: Iterable[Request], keys_of: PrefixKeys) -> PrefillsInFlight:
        prefills = cls(keys_of)
        for request in running:
            if request.num_computed_tokens < request.prompt_len:
                prefills.add(request)
        return prefills

    def add(self, request: Request) -> None:
        self._record.add(0, self._prompt_keys(request))

    def computes_beyond(self, request: Request, cached_len: int) -> bool:
        """Whether a prefill in flight computes at least one chunk of `request`'s prompt past the
        `cached_len` tokens the prefix cache gives it, that the request could take from the cache
        (none while its prompt is scored: it computes every token whatever is cached)."""
        shared = self._record.matched_chunks(0, self._prompt_keys(request)) * self._keys_of.chunk_tokens
        return min(shared, request.num_reusable_tokens) >= cached_len + self._keys_of.chunk_tokens

    def _prompt_keys(self, request: Request) -> list[int]:
        if request.prompt_prefix_keys is None:
            request.prompt_prefix_keys = self._keys_of(request.prompt_token_ids)
        return request.prompt_prefix_keys


def prompt_prefix_keys(block_size: int) -> PrefixKeys:
    return PrefixKeys(chunk_tokens_for(block_size))
