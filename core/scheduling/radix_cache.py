"""RadixCache: the prefix cache of one replica, a page-aligned radix tree over token ids.

Keys are the token ids of whole pages; a node holds a run of pages and the tokens written in them.
The scheduler calls:

* `match(token_ids)` at admission: the longest cached run of whole pages that prefixes the tokens
  (a node where the match ends inside it is split, so the match ends on a node);
* `lock(node)` / `unlock(node)` around the time a request uses the matched path: locked pages are
  never evicted;
* `publish(token_ids, pages, locked)` after every step, with a running request's FULL pages whose KV
  is written: they join the tree at once, so requests admitted later share them while their owner
  still runs, and the owner's lock moves down to the node that ends them;
* `insert(token_ids, pages)` when a request finishes or is preempted, with its FULL pages whose KV
  is written; pages whose tokens are already in the tree are handed back (the tree keeps its own);
* `evict(num_pages)` when the pool runs short: unlocked leaves, least recently used first.

Only full pages are ever inserted or matched, so a page a request still writes into is never
shared. The protocol with the pool: a request holds one pool reference on every page of the path
it locks (the scheduler increfs the matched pages when it locks them). Hence for every page in the
tree `pool.refcount(page) == node.lock_ref`, and the pages eviction can reclaim are exactly the
pool's cached ones; `check()` asserts both. With `enabled=False` (prefix caching off) `match` finds
nothing and `insert` takes nothing, so the scheduler has one code path.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from core.scheduling.block_pool import BlockPool

_TOKEN_BYTES = 4  # keys are the int32 bytes of the token ids: compact, and compared by memcmp


class _Node:
    __slots__ = ("id", "parent", "children", "key", "pages", "lock_ref", "last_access", "attached")

    def __init__(self, node_id: int, parent: _Node | None, key: bytes, pages: list[int]) -> None:
        self.id = node_id
        self.parent = parent
        self.children: dict[bytes, _Node] = {}  # by the key bytes of the child's first page
        self.key = key  # int32 bytes of the tokens in `pages`, len(pages) * block_size of them
        self.pages = pages
        self.lock_ref = 0  # locks on this node or below it
        self.last_access = 0  # the cache's clock when a match or insert last went through
        self.attached = True

    def __repr__(self) -> str:
        return f"_Node(id={self.id}, pages={len(self.pages)}, lock_ref={self.lock_ref})"


class Match(NamedTuple):
    pages: list[int]  # the matched pages, in token order
    length: int  # matched tokens, a multiple of block_size
    node: _Node  # where the match ends: lock it while using the pages


class _LruLeaves:
    """Eviction order: a heap of (last access, node id) with lazy deletion.

    A node is pushed whenever it may have become an evictable leaf; an entry whose node changed
    since (evicted, got children, locked, touched again) is dropped when it surfaces.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, _Node]] = []

    def push(self, node: _Node) -> None:
        if _is_evictable(node):
            heapq.heappush(self._heap, (node.last_access, node.id, node))

    def pop(self) -> _Node | None:
        while self._heap:
            last_access, _, node = heapq.heappop(self._heap)
            if _is_evictable(node) and node.last_access == last_access:
                return node
        return None

    def compact(self, live_nodes: int) -> None:
        """Drop stale entries once they outnumber the nodes, so the heap stays O(tree)."""
        if len(self._heap) > 2 * live_nodes + 64:
            self._heap = [e for e in self._heap if _is_evictable(e[2]) and e[2].last_access == e[0]]
            heapq.heapify(self._heap)

    def entries(self) -> set[tuple[int, int]]:
        return {(last_access, node_id) for last_access, node_id, _ in self._heap}

    def clear(self) -> None:
        self._heap.clear()


def _is_evictable(node: _Node) -> bool:
    return node.attached and node.parent is not None and not node.children and node.lock_ref == 0


class RadixCache:
    def __init__(self, pool: BlockPool, block_size: int, enabled: bool = True) -> None:
        self.pool = pool
        self.block_size = block_size
        self.enabled = enabled
        self._page_bytes = block_size * _TOKEN_BYTES
        self._ids = itertools.count()
        self._root = _Node(next(self._ids), None, b"", [])
        self._lru = _LruLeaves()
        self._clock = 0
        self.num_pages = 0  # pages in the tree, locked or not
        self.num_nodes = 0
        # Cumulative, never reset: tokens asked for in match() and tokens found.
        self.num_queries_tokens = 0
        self.num_hit_tokens = 0

    @property
    def root(self) -> _Node:
        return self._root

    # --- lookup -----------------------------------------------------------------------------------
    def match(self, token_ids: Sequence[int] | np.ndarray) -> Match:
        """The longest cached prefix of `token_ids` in whole pages (a trailing part page never matches)."""
        self.num_queries_tokens += len(token_ids)
        num_pages = len(token_ids) // self.block_size
        if not self.enabled or num_pages == 0:
            return Match([], 0, self._root)
        key = self._key(token_ids[: num_pages * self.block_size])
        self._clock += 1
        node, pages, num_matched = self._root, [], 0
        while num_matched < num_pages:
            child = node.children.get(self._page_key(key, num_matched))
            if child is None:
                break
            common = self._common_pages(child.key, key, num_matched)
            if common < len(child.pages):
                child = self._split(child, common)
            child.last_access = self._clock
            pages.extend(child.pages)
            node, num_matched = child, num_matched + common
        self._lru.push(node)
        self._lru.compact(self.num_nodes)
        length = num_matched * self.block_size
        self.num_hit_tokens += length
        return Match(pages, length, node)

    def peek(self, token_ids: Sequence[int] | np.ndarray) -> int:
        """Tokens of `token_ids` that match() would find, without touching the tree or its counters.

        The DP router calls this on every replica's tree for every new request; a real match splits
        nodes and refreshes LRU order, which only the replica that takes the request should do.
        """
        num_pages = len(token_ids) // self.block_size
        if not self.enabled or num_pages == 0:
            return 0
        key = self._key(token_ids[: num_pages * self.block_size])
        node, num_matched = self._root, 0
        while num_matched < num_pages:
            child = node.children.get(self._page_key(key, num_matched))
            if child is None:
                break
            common = self._common_pages(child.key, key, num_matched)
            num_matched += common
            if common < len(child.pages):
                break
            node = child
        return num_matched * self.block_size

    def lock(self, node: _Node) -> None:
        """Protect the path from `node` to the root from eviction (one lock per using request)."""
        while node is not self._root:
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: _Node) -> None:
        while node is not self._root:
            if node.lock_ref <= 0:
                raise ValueError(f"unlock of {node}, which is not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._lru.push(node)
            node = node.parent

    # --- update -----------------------------------------------------------------------------------
    def insert(self, token_ids: Sequence[int] | np.ndarray, pages: Sequence[int]) -> list[int]:
        """Add a request's full pages; returns those the tree did not take.

        `token_ids` are the tokens written in `pages`, exactly len(pages) * block_size of them.
        Where the tree already holds these tokens in another page, the request's page is a duplicate
        and comes back (the caller frees it by dropping its reference); pages the tree takes become
        cached when their owners let go. Disabled, the tree takes nothing.
        """
        self._check_full_pages(token_ids, pages)
        if not self.enabled or not pages:
            return list(pages)
        _, tree_pages = self._insert_below(self._root, self._key(token_ids), pages)
        return [mine for mine, theirs in zip(pages, tree_pages) if mine != theirs]

    def publish(self, token_ids: Sequence[int] | np.ndarray, pages: Sequence[int], locked: _Node) -> Match:
        """Add the next full pages of a running request that holds a lock on `locked`, the node that
        ends its pages already in the tree; `token_ids` are the new pages' tokens. The request's
        lock moves to the node that ends the new pages. Returns the tree's pages for the new ones
        (where the tree already held these tokens elsewhere, the caller swaps its duplicates for
        those), their length and the newly locked node. Disabled, nothing changes.
        """
        self._check_full_pages(token_ids, pages)
        if not self.enabled or not pages:
            return Match([], 0, locked)
        key = self._key(token_ids)
        self._clock += 1
        if locked is not self._root and locked.lock_ref == 1 and not locked.children:
            # A leaf only this request holds (a decode growing page by page): extend it in place
            # rather than hang a chain of one-page nodes under it.
            locked.key += key
            locked.pages.extend(pages)
            self._touch_path(locked)
            self.pool.mark_cached(pages)
            self.num_pages += len(pages)
            return Match(list(pages), len(token_ids), locked)
        node, tree_pages = self._insert_below(locked, key, pages)
        self._touch_path(node)
        self.lock(node)
        self.unlock(locked)
        return Match(tree_pages, len(token_ids), node)

    def _touch_path(self, node: _Node) -> None:
        """Mark `node` and its ancestors used now (a parent is never older than its children)."""
        while node is not self._root:
            node.last_access = self._clock
            node = node.parent

    def _check_full_pages(self, token_ids: Sequence[int] | np.ndarray, pages: Sequence[int]) -> None:
        if len(token_ids) != len(pages) * self.block_size:
            raise ValueError(
                f"insert of {len(pages)} pages needs {len(pages) * self.block_size} tokens "
                f"(block_size {self.block_size}), got {len(token_ids)}: only full pages go in the cache"
            )

    def _insert_below(self, node: _Node, key: bytes, pages: Sequence[int]) -> tuple[_Node, list[int]]:
        """Add `pages` (tokens `key`) under `node`; returns the node that ends them and the tree's
        page for each of them (the caller's own where the tree took it)."""
        self._clock += 1
        num_done, tree_pages = 0, []
        while num_done < len(pages):
            child = node.children.get(self._page_key(key, num_done))
            if child is None:
                rest = key[num_done * self._page_bytes :]
                child = _Node(next(self._ids), node, rest, list(pages[num_done:]))
                self.pool.mark_cached(child.pages)
                node.children[child.key[: self._page_bytes]] = child
                self.num_pages += len(child.pages)
                self.num_nodes += 1
                common = len(child.pages)
            else:
                common = self._common_pages(child.key, key, num_done)
                if common < len(child.pages):
                    child = self._split(child, common)
            tree_pages.extend(child.pages)
            child.last_access = self._clock
            node, num_done = child, num_done + common
        self._lru.push(node)
        self._lru.compact(self.num_nodes)
        return node, tree_pages

    def evict(self, num_pages: int) -> int:
        """Free up to `num_pages` unlocked pages, least recently used leaves first; returns how many.

        A leaf longer than what is still needed loses only its tail pages and stays in the tree.
        """
        num_freed = 0
        while num_freed < num_pages:
            node = self._lru.pop()
            if node is None:
                break
            wanted = num_pages - num_freed
            if wanted < len(node.pages):
                tail = node.pages[-wanted:]
                node.pages = node.pages[:-wanted]
                node.key = node.key[: len(node.pages) * self._page_bytes]
                self._lru.push(node)
            else:
                tail = node.pages
                del node.parent.children[node.key[: self._page_bytes]]
                node.attached = False
                self.num_nodes -= 1
                self._lru.push(node.parent)
            self.num_pages -= len(tail)
            num_freed += self.pool.mark_uncached(tail)
        return num_freed

    def reset(self) -> None:
        """Drop every cached page. Only while no request holds a lock (the engine is idle)."""
        locked = sum(child.lock_ref for child in self._root.children.values())
        if locked:
            raise RuntimeError(f"cannot reset the prefix cache: {locked} locks are held by running requests")
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            node.attached = False
            self.pool.mark_uncached(node.pages)
        self._root.children.clear()
        self._lru.clear()
        self.num_pages = self.num_nodes = 0

    # --- invariant --------------------------------------------------------------------------------
    def check(self) -> None:
        """Tree shape, lock counts, LRU order and agreement with the pool. O(tree + num_pages)."""
        if not self.enabled:
            assert not self._root.children, "a disabled cache holds nodes"
        seen_pages: set[int] = set()
        lru_entries = self._lru.entries()
        num_nodes = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            child_locks = 0
            for first_page, child in node.children.items():
                num_nodes += 1
                assert child.attached and child.parent is node, f"{child} has a wrong parent"
                assert child.pages, f"{child} holds no page"
                assert len(child.key) == len(child.pages) * self._page_bytes, f"{child} key/page mismatch"
                assert child.key[: self._page_bytes] == first_page, f"{child} is filed under another key"
                assert child.lock_ref >= 0, f"{child} has lock_ref {child.lock_ref}"
                if node is not self._root:
                    assert node.last_access >= child.last_access, f"{child} was used after its parent"
                child_locks += child.lock_ref
                stack.append(child)
            if node is self._root:
                continue
            assert node.lock_ref >= child_locks, f"{node} has fewer locks than its children"
            for page in node.pages:
                assert page not in seen_pages, f"page {page} is twice in the tree"
                seen_pages.add(page)
                assert self.pool.is_cached(page), f"page {page} is in the tree but the pool says uncached"
                assert self.pool.refcount(page) == node.lock_ref, (
                    f"page {page} of {node} has refcount {self.pool.refcount(page)} but lock_ref "
                    f"{node.lock_ref}: a request holds a page without locking it, or the reverse")
            if _is_evictable(node):
                assert (node.last_access, node.id) in lru_entries, f"evictable {node} is not in the LRU"
        assert num_nodes == self.num_nodes, f"{num_nodes} nodes, counter says {self.num_nodes}"
        assert len(seen_pages) == self.num_pages, f"{len(seen_pages)} pages, counter says {self.num_pages}"
        in_pool = sum(self.pool.is_cached(page) for page in range(self.pool.num_pages))
        assert in_pool == self.num_pages, f"pool: {in_pool} pages in cache, tree: {self.num_pages}"

    # --- helpers ----------------------------------------------------------------------------------
    @staticmethod
    def _key(token_ids: Sequence[int] | np.ndarray) -> bytes:
        return np.asarray(token_ids, dtype=np.int32).tobytes()

    def _page_key(self, key: bytes, page: int) -> bytes:
        return key[page * self._page_bytes : (page + 1) * self._page_bytes]

    def _common_pages(self, node_key: bytes, key: bytes, first_page: int) -> int:
        """Whole pages node_key shares with key[first_page:] (the first one is known to agree)."""
        start = first_page * self._page_bytes
        num_pages = min(len(node_key), len(key) - start) // self._page_bytes
        if node_key[: num_pages * self._page_bytes] == key[start : start + num_pages * self._page_bytes]:
            return num_pages
        common = 1
        while self._page_key(node_key, common) == self._page_key(key, first_page + common):
            common += 1
        return common

    def _split(self, node: _Node, num_pages: int) -> _Node:
        """Cut `node` after `num_pages` pages; returns the new upper part, which the caller uses."""
        cut = num_pages * self._page_bytes
        upper = _Node(next(self._ids), node.parent, node.key[:cut], node.pages[:num_pages])
        upper.lock_ref = node.lock_ref  # every lock through `node` also goes through `upper`
        upper.last_access = node.last_access
        node.parent.children[upper.key[: self._page_bytes]] = upper
        node.key, node.pages, node.parent = node.key[cut:], node.pages[num_pages:], upper
        upper.children[node.key[: self._page_bytes]] = node
        self.num_nodes += 1
        return upper
