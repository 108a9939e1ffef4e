"""BlockPool: the KV-cache pages of one replica and who holds them.

The scheduler and the radix cache share one pool. Every page is in exactly one of three states:

* free: nobody holds it; `allocate` hands it out.
* cached: only the prefix cache holds it (refcount 0); evicting it makes it free again.
* owned: one or more requests hold it (refcount >= 1); it may also be in the prefix cache, in which
  case it becomes cached, not free, when its last owner lets go.

A request takes one reference on each page it uses: pages it allocated and pages it reuses from a
prefix-cache match alike, so releasing a request is one `decref` of all its pages. The pool never
decides anything; `check()` states the invariant and tests call it after every operation.

`allocate` raises `PoolExhaustedError` when too few pages are free: callers look at `num_free`
first (and evict from the cache), so running out inside `allocate` is a bug, not a policy.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class PoolExhaustedError(RuntimeError):
    """`allocate` asked for more pages than are free."""


class BlockPool:
    def __init__(self, num_pages: int) -> None:
        if num_pages < 1:
            raise ValueError(f"a block pool needs at least one page, got {num_pages}")
        self.num_pages = num_pages
        self._refcount = [0] * num_pages
        self._in_cache = [False] * num_pages
        self._free: deque[int] = deque(range(num_pages))
        self._num_owned = 0
        self._num_cached = 0  # in the cache with refcount 0: what eviction can reclaim

    # --- counts -----------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Pages held only by the prefix cache (evictable)."""
        return self._num_cached

    @property
    def num_owned(self) -> int:
        """Pages some request holds (shared prefix pages count once)."""
        return self._num_owned

    @property
    def usage(self) -> float:
        """Fraction of pages owned by requests: what the running batch really occupies."""
        return self._num_owned / self.num_pages

    def refcount(self, page: int) -> int:
        return self._refcount[page]

    def is_cached(self, page: int) -> bool:
        """Whether the prefix cache holds the page (owned or not)."""
        return self._in_cache[page]

    # --- requests ---------------------------------------------------------------------------------
    def allocate(self, num_pages: int) -> list[int]:
        """`num_pages` free pages, each now owned once by the caller."""
        if num_pages > len(self._free):
            raise PoolExhaustedError(
                f"asked for {num_pages} pages but only {len(self._free)} of {self.num_pages} are free "
                f"({self._num_cached} cached, {self._num_owned} owned): evict before allocating"
            )
        pages = [self._free.popleft() for _ in range(num_pages)]
        for page in pages:
            self._refcount[page] = 1
        self._num_owned += num_pages
        return pages

    def incref(self, pages: Iterable[int]) -> None:
        """Take one more reference on pages that are owned or cached (a prefix-cache hit)."""
        refcount = self._refcount
        for page in pages:
            if refcount[page] == 0:
                if not self._in_cache[page]:
                    raise ValueError(f"page {page} is free: allocate it instead of taking a reference")
                self._num_cached -= 1
                self._num_owned += 1
            refcount[page] += 1

    def decref(self, pages: Iterable[int]) -> None:
        """Drop one reference; a page nobody holds any more becomes cached or free."""
        refcount = self._refcount
        for page in pages:
            if refcount[page] == 0:
                raise ValueError(f"page {page} has no reference to drop (double free?)")
            refcount[page] -= 1
            if refcount[page] == 0:
                self._num_owned -= 1
                if self._in_cache[page]:
                    self._num_cached += 1
                else:
                    self._free.append(page)

    # --- prefix cache -----------------------------------------------------------------------------
    def mark_cached(self, pages: Iterable[int]) -> None:
        """The prefix cache takes owned pages (a finished request's full pages)."""
        for page in pages:
            if self._refcount[page] == 0:
                raise ValueError(f"page {page} is not owned: only pages a request holds can be cached")
            if self._in_cache[page]:
                raise ValueError(f"page {page} is already in the prefix cache")
            self._in_cache[page] = True

    def mark_uncached(self, pages: Iterable[int]) -> int:
        """The prefix cache lets pages go (eviction, reset); returns how many became free."""
        num_freed = 0
        for page in pages:
            if not self._in_cache[page]:
                raise ValueError(f"page {page} is not in the prefix cache")
            self._in_cache[page] = False
            if self._refcount[page] == 0:
                self._num_cached -= 1
                self._free.append(page)
                num_freed += 1
        return num_freed

    # --- invariant --------------------------------------------------------------------------------
    def check(self) -> None:
        """Every page is exactly one of free, cached, owned, and the counts say so. O(num_pages)."""
        free = set(self._free)
        assert len(free) == len(self._free), "a page is twice in the free list"
        num_owned = num_cached = 0
        for page in range(self.num_pages):
            refcount, in_cache = self._refcount[page], self._in_cache[page]
            assert refcount >= 0, f"page {page} has refcount {refcount}"
            if page in free:
                assert refcount == 0 and not in_cache, (
                    f"page {page} is free but has refcount {refcount}, in cache {in_cache}")
            elif refcount > 0:
                num_owned += 1
            else:
                assert in_cache, f"page {page} is neither free, cached nor owned (leaked)"
                num_cached += 1
        assert num_owned == self._num_owned, f"{num_owned} pages owned, counter says {self._num_owned}"
        assert num_cached == self._num_cached, f"{num_cached} pages cached, counter says {self._num_cached}"
        assert len(free) + num_owned + num_cached == self.num_pages

    def __repr__(self) -> str:
        return (f"BlockPool({self.num_pages} pages: {self.num_free} free, {self._num_cached} cached, "
                f"{self._num_owned} owned)")
