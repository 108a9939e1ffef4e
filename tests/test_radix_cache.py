"""RadixCache: page-aligned prefix matching, locking, duplicate hand-back and LRU eviction."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from core.scheduling.block_pool import BlockPool
from core.scheduling.radix_cache import Match, RadixCache

BS = 4  # block size of the unit tests


def make(num_pages: int = 32, enabled: bool = True) -> tuple[BlockPool, RadixCache]:
    pool = BlockPool(num_pages)
    return pool, RadixCache(pool, BS, enabled=enabled)


def acquire(cache: RadixCache, tokens: list[int]) -> Match:
    """What the scheduler does at admission: match, then hold and lock the matched pages."""
    match = cache.match(tokens)
    cache.pool.incref(match.pages)
    cache.lock(match.node)
    return match


def compute(cache: RadixCache, tokens: list[int]) -> list[int]:
    """A request that computes `tokens` from scratch and finishes: returns its pages (now cached)."""
    pages = cache.pool.allocate(len(tokens) // BS)
    cache.insert(tokens, pages)
    cache.pool.decref(pages)
    return pages


def checked(cache: RadixCache) -> None:
    cache.pool.check()
    cache.check()


def test_an_empty_cache_matches_nothing():
    _, cache = make()
    match = cache.match(list(range(10)))
    assert match.pages == [] and match.length == 0 and match.node is cache.root


def test_a_finished_requests_full_pages_are_matched_in_order():
    pool, cache = make()
    tokens = list(range(12))
    pages = compute(cache, tokens)
    assert pool.num_cached == 3 and pool.num_owned == 0
    match = cache.match(tokens + [99, 98])
    assert match.pages == pages and match.length == 12
    checked(cache)


def test_a_match_ending_mid_page_never_shares_the_page_being_written():
    _, cache = make()
    pages = compute(cache, list(range(8)))
    # Tokens 0..6: the second page would be shared while its 8th token is still to be written.
    match = cache.match(list(range(7)))
    assert match.pages == pages[:1] and match.length == 4
    checked(cache)


def test_a_match_ending_inside_a_node_splits_it_there():
    _, cache = make()
    pages = compute(cache, list(range(12)))
    assert cache.num_nodes == 1
    match = cache.match(list(range(8)) + [50, 51, 52, 53])
    assert match.pages == pages[:2] and match.length == 8
    assert cache.num_nodes == 2 and match.node.pages == pages[:2]
    assert cache.match(list(range(12))).pages == pages
    checked(cache)


def test_insert_hands_back_pages_whose_tokens_are_already_cached():
    pool, cache = make()
    first = compute(cache, list(range(8)))
    # Another request computed the same 8 tokens (and 4 more) in its own pages at the same time.
    mine = pool.allocate(3)
    not_taken = cache.insert(list(range(12)), mine)
    assert not_taken == mine[:2]
    pool.decref(mine)
    assert not any(pool.is_cached(p) for p in mine[:2]) and pool.num_free == 32 - 3
    assert cache.match(list(range(12))).pages == first + mine[2:]
    checked(cache)


def test_insert_takes_back_a_requests_own_matched_pages_without_duplicates():
    pool, cache = make()
    compute(cache, list(range(8)))
    match = acquire(cache, list(range(8)) + [7, 7, 7, 7])
    extra = pool.allocate(1)
    cache.unlock(match.node)
    assert cache.insert(list(range(8)) + [7, 7, 7, 7], match.pages + extra) == []
    pool.decref(match.pages + extra)
    assert pool.num_cached == 3 and pool.num_owned == 0
    checked(cache)


def test_insert_accepts_only_whole_pages():
    pool, cache = make()
    with pytest.raises(ValueError, match="only full pages go in the cache"):
        cache.insert(list(range(6)), pool.allocate(2))


def test_eviction_never_touches_a_locked_page():
    pool, cache = make(num_pages=8)
    locked_pages = compute(cache, [1] * 8)
    compute(cache, [2] * 8)
    match = acquire(cache, [1] * 8 + [0])
    assert cache.evict(8) == 2  # only the unlocked run can go
    assert all(pool.is_cached(p) and pool.refcount(p) == 1 for p in locked_pages)
    assert cache.match([1] * 8).pages == locked_pages
    cache.unlock(match.node)
    pool.decref(match.pages)
    assert cache.evict(8) == 2
    checked(cache)


def test_eviction_takes_the_least_recently_used_leaf_first():
    pool, cache = make()
    a = compute(cache, [1] * 4)
    b = compute(cache, [2] * 4)
    c = compute(cache, [3] * 4)
    cache.match([1] * 4)  # a is used again: b is now the oldest
    assert cache.evict(1) == 1
    assert not pool.is_cached(b[0]) and pool.is_cached(a[0]) and pool.is_cached(c[0])
    assert cache.evict(1) == 1
    assert not pool.is_cached(c[0]) and pool.is_cached(a[0])
    checked(cache)


def test_eviction_of_a_long_leaf_takes_only_its_tail():
    pool, cache = make()
    pages = compute(cache, list(range(16)))
    assert cache.evict(1) == 1
    assert cache.match(list(range(16))).pages == pages[:3]
    assert pool.num_free == 32 - 3
    checked(cache)


def test_eviction_frees_children_before_their_parent():
    pool, cache = make()
    shared = compute(cache, [5] * 4)
    compute(cache, [5] * 4 + [6] * 4)
    compute(cache, [5] * 4 + [7] * 4)
    assert cache.evict(2) == 2
    assert pool.is_cached(shared[0]) and pool.num_cached == 1
    assert cache.evict(5) == 1 and pool.num_free == 32
    checked(cache)


def test_a_lock_holds_across_a_split_of_its_path():
    pool, cache = make()
    compute(cache, list(range(12)))
    match = acquire(cache, list(range(12)) + [0])
    compute(cache, list(range(4)) + [9] * 8)  # splits the locked node after its first page
    checked(cache)
    assert cache.evict(32) == 2  # only the new branch
    cache.unlock(match.node)
    pool.decref(match.pages)
    checked(cache)
    assert cache.evict(32) == 3 and pool.num_free == 32


def test_unlock_of_an_unlocked_node_is_an_error():
    _, cache = make()
    compute(cache, [1] * 4)
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(cache.match([1] * 4).node)


def test_reset_drops_every_page_but_refuses_while_a_request_holds_a_lock():
    pool, cache = make()
    compute(cache, [1] * 8)
    compute(cache, [2] * 8)
    match = acquire(cache, [1] * 8 + [0])
    with pytest.raises(RuntimeError, match="1 locks are held"):
        cache.reset()
    cache.unlock(match.node)
    pool.decref(match.pages)
    cache.reset()
    assert pool.num_free == 32 and cache.num_pages == 0 and cache.match([1] * 8).length == 0
    checked(cache)


def test_counters_count_queried_and_hit_tokens():
    _, cache = make()
    compute(cache, [1] * 8)
    cache.match([1] * 10)
    cache.match([2] * 6)
    assert (cache.num_queries_tokens, cache.num_hit_tokens) == (16, 8)


def test_a_disabled_cache_matches_nothing_and_takes_nothing():
    pool, cache = make(enabled=False)
    pages = pool.allocate(2)
    assert cache.insert(list(range(8)), pages) == pages
    pool.decref(pages)
    assert cache.match(list(range(8))).length == 0
    assert pool.num_free == 32 and cache.evict(4) == 0
    checked(cache)


def test_check_catches_a_page_held_without_a_lock():
    pool, cache = make()
    [page] = compute(cache, [1] * 4)
    pool.incref([page])  # a request took the page but never locked its node
    with pytest.raises(AssertionError, match="without locking"):
        cache.check()


class RadixCacheMachine(RuleBasedStateMachine):
    """Requests that match, lock, compute, finish; plus evictions and resets, checked after every step.

    A model of what each page holds (`content`) proves that a match only ever returns pages
    holding exactly the matched tokens.
    """

    NUM_PAGES, BLOCK_SIZE = 24, 2

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(self.NUM_PAGES)
        self.cache = RadixCache(self.pool, self.BLOCK_SIZE)
        self.content: dict[int, tuple[int, ...]] = {}  # page -> the tokens written in it
        self.live: list[tuple[list[int], list[int], Match]] = []  # running requests

    def _page_tokens(self, tokens: list[int], index: int) -> tuple[int, ...]:
        return tuple(tokens[index * self.BLOCK_SIZE : (index + 1) * self.BLOCK_SIZE])

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=11))
    def start_request(self, tokens):
        match = self.cache.match(tokens)
        assert match.length % self.BLOCK_SIZE == 0 and match.length <= len(tokens)
        assert match.length == len(match.pages) * self.BLOCK_SIZE
        for index, page in enumerate(match.pages):
            assert self.content[page] == self._page_tokens(tokens, index), "a match returned wrong KV"
        self.pool.incref(match.pages)
        self.cache.lock(match.node)
        num_needed = -(-len(tokens) // self.BLOCK_SIZE) - len(match.pages)
        if self.pool.num_free < num_needed:
            self.cache.evict(num_needed - self.pool.num_free)
        if self.pool.num_free < num_needed:
            self.cache.unlock(match.node)
            self.pool.decref(match.pages)
            return
        pages = match.pages + self.pool.allocate(num_needed)
        for index in range(len(match.pages), len(pages)):
            self.content[pages[index]] = self._page_tokens(tokens, index)
        self.live.append((tokens, pages, match))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish_request(self, data):
        tokens, pages, match = self.live.pop(data.draw(st.integers(0, len(self.live) - 1)))
        self.cache.unlock(match.node)
        num_full = len(tokens) // self.BLOCK_SIZE
        not_taken = self.cache.insert(tokens[: num_full * self.BLOCK_SIZE], pages[:num_full])
        assert set(not_taken) <= set(pages[len(match.pages) : num_full])
        assert not any(self.pool.is_cached(p) for p in not_taken), "a handed-back page stayed in the tree"
        self.pool.decref(pages)
        assert not any(self.pool.is_cached(p) for p in pages[num_full:]), "a partial page was cached"

    @rule(tokens=st.lists(st.integers(0, 2), min_size=0, max_size=11))
    def match_only(self, tokens):
        match = self.cache.match(tokens)
        for index, page in enumerate(match.pages):
            assert self.content[page] == self._page_tokens(tokens, index), "a match returned wrong KV"

    @rule(num_pages=st.integers(0, 10))
    def evict(self, num_pages):
        evictable = self.pool.num_cached
        held = [p for _, pages, match in self.live for p in match.pages]
        assert self.cache.evict(num_pages) == min(num_pages, evictable)
        assert all(self.pool.is_cached(p) for p in held), "eviction touched a locked page"

    @precondition(lambda self: not self.live)
    @rule()
    def reset(self):
        self.cache.reset()
        assert self.pool.num_free == self.NUM_PAGES

    @invariant()
    def consistent(self):
        self.pool.check()
        self.cache.check()
        owned = {p for _, pages, _ in self.live for p in pages}
        assert self.pool.num_owned == len(owned)


TestRadixCacheMachine = RadixCacheMachine.TestCase
TestRadixCacheMachine.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
