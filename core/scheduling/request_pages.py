"""RequestPages: the KV pages of running requests, shared through the prefix cache.

The scheduler decides who runs and who is preempted; this module does the page bookkeeping those
decisions need: allocating (evicting cached pages when the pool runs short), attaching a prefix-cache
match to an admitted request, publishing a running request's newly written full pages to the
radix tree, and giving everything back when the request stops running. The block pool counts
references, the radix cache locks the nodes a running request reads, and the running table keeps
each request's block-table row for the plans.
"""

from __future__ import annotations

from core.scheduling.block_pool import BlockPool
from core.scheduling.radix_cache import Match, RadixCache
from core.scheduling.request import Request
from core.scheduling.running_table import RunningTable


class RequestPages:
    def __init__(self, pool: BlockPool, cache: RadixCache, running: RunningTable, block_size: int) -> None:
        self.pool = pool
        self.cache = cache
        self.running = running
        self.block_size = block_size

    def allocate(self, num_pages: int) -> list[int] | None:
        """`num_pages` pages, evicting from the prefix cache if needed; None if even that is not enough."""
        if num_pages <= 0:
            return []
        short = num_pages - self.pool.num_free
        if short > 0 and self.pool.num_cached >= short:
            self.cache.evict(short)
        if self.pool.num_free < num_pages:
            return None
        return self.pool.allocate(num_pages)

    def hold(self, match: Match) -> None:
        """Keep a prefix-cache match's pages from eviction while its request is being admitted."""
        self.pool.incref(match.pages)
        self.cache.lock(match.node)

    def unhold(self, match: Match) -> None:
        self.cache.unlock(match.node)
        self.pool.decref(match.pages)

    def attach(self, request: Request, match: Match, pages: list[int]) -> None:
        """Give an admitted request a row, the held match's pages and `pages` after them."""
        request.cache_node = match.node
        request.num_published_pages = len(match.pages)
        self.running.assign(request)
        self.running.add_pages(request, match.pages + pages)

    def extend(self, request: Request, pages: list[int]) -> None:
        self.running.add_pages(request, pages)

    def publish_written(self, request: Request) -> None:
        """Share a running request's newly written full pages through the prefix cache right away.

        Where the tree already held those tokens (another request wrote the same prefix in the
        same step), the request switches to the tree's pages and frees its duplicates.
        """
        first, num_full = request.num_published_pages, request.num_computed_tokens // self.block_size
        block_size = self.block_size
        match = self.cache.publish(request.all_token_ids[first * block_size : num_full * block_size],
                                   request.pages[first:num_full], request.cache_node)
        request.cache_node = match.node
        for index, tree in enumerate(match.pages, start=first):
            mine = request.pages[index]
            if mine != tree:
                self.pool.incref([tree])
                self.pool.decref([mine])
                self.running.replace_page(request, index, tree)
        request.num_published_pages = num_full

    def release(self, request: Request, publish: bool) -> None:
        """Give back a running request's pages and row; `publish`: its written full pages go to the cache."""
        self.cache.unlock(request.cache_node)
        request.cache_node = None
        request.num_published_pages = 0
        if publish:
            # Only tokens [0, num_computed_tokens) have KV; the last sampled token has none yet.
            num_full = request.num_computed_tokens // self.block_size
            self.cache.insert(request.all_token_ids[: num_full * self.block_size], request.pages[:num_full])
        self.pool.decref(request.pages)  # duplicates of cached pages and the partial page become free
        self.running.release(request)
        request.pages = []
