"""BlockPool: every page is free, cached or owned, and the counts always say which."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from core.scheduling.block_pool import BlockPool, PoolExhaustedError


def test_allocate_hands_out_distinct_owned_pages():
    pool = BlockPool(8)
    pages = pool.allocate(5)
    assert len(set(pages)) == 5 and all(0 <= p < 8 for p in pages)
    assert (pool.num_free, pool.num_owned, pool.num_cached) == (3, 5, 0)
    assert all(pool.refcount(p) == 1 for p in pages)
    assert pool.usage == 5 / 8
    pool.check()


def test_allocating_more_than_free_raises_and_changes_nothing():
    pool = BlockPool(4)
    pool.allocate(3)
    with pytest.raises(PoolExhaustedError, match="asked for 2 pages but only 1 of 4 are free"):
        pool.allocate(2)
    assert pool.num_free == 1
    pool.check()


def test_last_decref_frees_an_uncached_page_and_caches_a_cached_one():
    pool = BlockPool(4)
    kept, dropped = pool.allocate(2)
    pool.mark_cached([kept])
    pool.decref([kept, dropped])
    assert not pool.is_cached(dropped) and pool.num_free == 3
    assert pool.is_cached(kept) and pool.num_cached == 1 and pool.num_owned == 0
    pool.check()


def test_a_shared_page_stays_owned_until_its_last_reference_goes():
    pool = BlockPool(2)
    [page] = pool.allocate(1)
    pool.mark_cached([page])
    pool.incref([page])
    pool.decref([page])
    assert pool.refcount(page) == 1 and pool.num_owned == 1
    pool.decref([page])
    assert pool.num_cached == 1 and pool.num_owned == 0
    pool.check()


def test_a_cache_hit_turns_a_cached_page_back_into_an_owned_one():
    pool = BlockPool(2)
    [page] = pool.allocate(1)
    pool.mark_cached([page])
    pool.decref([page])
    pool.incref([page])
    assert (pool.num_cached, pool.num_owned, pool.refcount(page)) == (0, 1, 1)
    pool.check()


def test_uncaching_frees_only_pages_nobody_owns():
    pool = BlockPool(4)
    owned, cached_only = pool.allocate(2)
    pool.mark_cached([owned, cached_only])
    pool.decref([cached_only])
    assert pool.mark_uncached([owned, cached_only]) == 1
    assert pool.refcount(owned) == 1 and not pool.is_cached(owned)
    assert pool.num_free == 3
    pool.check()


@pytest.mark.parametrize("misuse, message", [
    (lambda pool, page: pool.decref([page, page]), "no reference to drop"),
    (lambda pool, page: pool.incref([3]), "page 3 is free"),
    (lambda pool, page: pool.mark_cached([page, page]), "already in the prefix cache"),
    (lambda pool, page: pool.mark_cached([3]), "not owned"),
    (lambda pool, page: pool.mark_uncached([page]), "not in the prefix cache"),
])
def test_misuse_names_the_page(misuse, message):
    pool = BlockPool(4)
    [page] = pool.allocate(1)
    with pytest.raises(ValueError, match=message):
        misuse(pool, page)


def test_check_catches_a_leaked_page():
    pool = BlockPool(2)
    [page] = pool.allocate(1)
    pool._refcount[page] = 0  # as if a decref forgot to return it
    with pytest.raises(AssertionError, match="leaked"):
        pool.check()


class BlockPoolMachine(RuleBasedStateMachine):
    """Random allocate / incref / decref / cache / uncache against a model of the refcounts."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(12)
        self.refs: dict[int, int] = {}  # the model: references per page
        self.cached: set[int] = set()

    @rule(n=st.integers(0, 5))
    def allocate(self, n):
        if n > self.pool.num_free:
            with pytest.raises(PoolExhaustedError):
                self.pool.allocate(n)
            return
        for page in self.pool.allocate(n):
            assert self.refs.get(page, 0) == 0 and page not in self.cached
            self.refs[page] = 1

    @precondition(lambda self: self.refs or self.cached)
    @rule(data=st.data())
    def incref(self, data):
        page = data.draw(st.sampled_from(sorted(set(self.refs) | self.cached)))
        self.pool.incref([page])
        self.refs[page] = self.refs.get(page, 0) + 1

    @precondition(lambda self: self.refs)
    @rule(data=st.data())
    def decref(self, data):
        page = data.draw(st.sampled_from(sorted(self.refs)))
        self.pool.decref([page])
        self.refs[page] -= 1
        if not self.refs[page]:
            del self.refs[page]

    @precondition(lambda self: set(self.refs) - self.cached)
    @rule(data=st.data())
    def mark_cached(self, data):
        page = data.draw(st.sampled_from(sorted(set(self.refs) - self.cached)))
        self.pool.mark_cached([page])
        self.cached.add(page)

    @precondition(lambda self: self.cached)
    @rule(data=st.data())
    def mark_uncached(self, data):
        page = data.draw(st.sampled_from(sorted(self.cached)))
        assert self.pool.mark_uncached([page]) == (0 if page in self.refs else 1)
        self.cached.discard(page)

    @invariant()
    def counts_match_the_model(self):
        self.pool.check()
        assert self.pool.num_owned == len(self.refs)
        assert self.pool.num_cached == len(self.cached - set(self.refs))
        assert self.pool.num_free == 12 - len(set(self.refs) | self.cached)


TestBlockPoolMachine = BlockPoolMachine.TestCase
TestBlockPoolMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
