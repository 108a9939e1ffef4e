"""The DP router alone: bursts of groups sharing a long prefix stay together, loads stay bounded,
unrelated prompts spread by load, a dead replica is forgotten, and the simulated prefix hit rate
of N replicas stays within 2 points of one replica's.

The workload is the shared-prefix benchmark's: 32 groups x 16 prompts, a 2,048-token system
prompt and a 128-token question each, 64 tokens out, in shuffled order. A replica's simulated
hits are the leading whole pages of a prompt it has been routed before (what its radix tree
holds a step later), counted by a chained hash of page bytes that shares nothing with the
router's own keys.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from benchmarks.dp_routing import measure
from core.scheduling.dp_router import SHARED_PREFIX_WEIGHT, DPRouter, Route
from core.scheduling.routed_prefixes import PrefixKeys, chunk_tokens_for

BS = 16
SYSTEM_LEN, QUESTION_LEN, MAX_TOKENS = 2048, 128, 64
GROUPS, PER_GROUP = 32, 16


def shared_prefix_burst(seed: int = 0, groups: int = GROUPS) -> list[tuple[int, np.ndarray]]:
    """(group, prompt) in arrival order."""
    rng = np.random.default_rng(seed)
    prompts = []
    for group in range(groups):
        system = rng.integers(0, 151_000, SYSTEM_LEN, dtype=np.int32)
        for _ in range(PER_GROUP):
            prompts.append((group, np.concatenate([system, rng.integers(0, 151_000, QUESTION_LEN,
                                                                        dtype=np.int32)])))
    return [prompts[i] for i in rng.permutation(len(prompts))]


def page_hashes(prompt: np.ndarray) -> list[int]:
    """Hash i stands for the prompt's first i + 1 pages."""
    data, chained, out = prompt.tobytes(), 0, []
    page_bytes = BS * prompt.itemsize
    for start in range(0, len(prompt) // BS * page_bytes, page_bytes):
        chained = hash((chained, data[start : start + page_bytes]))
        out.append(chained)
    return out


def leading_run(hashes: list[int], held: set[int]) -> int:
    run = 0
    while run < len(hashes) and hashes[run] in held:
        run += 1
    return run


class Replay:
    """Routes prompts as the scheduler process does and keeps what the replicas would hold.

    `concurrency`: at most that many routed and unfinished; the oldest finishes first and its pages
    enter its replica's cache (what cached_prefix_len then finds). None: nothing finishes.
    """

    def __init__(self, num_replicas: int, concurrency: int | None = None) -> None:
        self.router = DPRouter(num_replicas, BS)
        self.live = list(range(num_replicas))
        self.concurrency = concurrency
        self.seen = [set() for _ in range(num_replicas)]  # pages of every prompt routed there
        self.cached = [set() for _ in range(num_replicas)]  # pages of every prompt finished there
        self.in_flight: deque[tuple[str, int, list[int]]] = deque()
        self.hit_tokens = self.prompt_tokens = 0
        self.replicas_of_group: dict[int, set[int]] = {}
        self.max_gap = 0  # the most and least loaded replicas' difference, after any arrival
        self.gap_bound = 0  # W x prompt + max_tokens of the largest request routed
        self.count = 0

    def route(self, group: int, prompt: np.ndarray) -> int:
        if self.concurrency is not None and len(self.in_flight) >= self.concurrency:
            self.finish_oldest()
        hashes = page_hashes(prompt)
        route = self.router.pick(self.live, prompt, MAX_TOKENS,
                                 lambda r: leading_run(hashes, self.cached[r]) * BS)
        request_id = f"r{self.count}"
        self.count += 1
        self.router.assign(request_id, route)
        self.in_flight.append((request_id, route.replica, hashes))
        self.hit_tokens += leading_run(hashes, self.seen[route.replica]) * BS
        self.prompt_tokens += len(prompt)
        self.seen[route.replica].update(hashes)
        self.replicas_of_group.setdefault(group, set()).add(route.replica)
        loads = [self.router.load_tokens[r] for r in self.live]
        self.max_gap = max(self.max_gap, max(loads) - min(loads))
        self.gap_bound = max(self.gap_bound, SHARED_PREFIX_WEIGHT * len(prompt) + MAX_TOKENS)
        return route.replica

    def finish_oldest(self) -> None:
        request_id, replica, hashes = self.in_flight.popleft()
        assert self.router.release(request_id) == replica
        self.cached[replica].update(hashes)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens

    @property
    def extra_replicas(self) -> int:
        """Over all groups, the replicas a group was spread over beyond its first."""
        return sum(len(replicas) - 1 for replicas in self.replicas_of_group.values())


def replay(num_replicas: int, concurrency: int | None, seed: int = 0) -> Replay:
    run = Replay(num_replicas, concurrency)
    for group, prompt in shared_prefix_burst(seed):
        run.route(group, prompt)
    return run


# --- the prefix keys --------------------------------------------------------------------------------

def test_record_granularity_is_whole_pages_of_at_least_64_tokens():
    assert [chunk_tokens_for(b) for b in (1, 16, 64, 128, 256)] == [64, 64, 64, 128, 256]


def test_prefix_keys_agree_exactly_as_far_as_the_prompts_do():
    keys = PrefixKeys(64)
    rng = np.random.default_rng(1)
    a = rng.integers(0, 151_000, 1000, dtype=np.int32)
    b = a.copy()
    b[200] += 1  # inside the fourth chunk
    ka, kb = keys(a), keys(b)
    assert len(ka) == 1000 // 64
    assert ka[:3] == kb[:3] and all(x != y for x, y in zip(ka[3:], kb[3:]))
    assert keys(a.tolist()) == ka  # a list of ids is the same prompt
    assert keys(a[:63]) == []  # shorter than a chunk: nothing to share


def test_prefix_keys_count_token_zero():
    keys = PrefixKeys(64)
    zeros = keys(np.zeros(256, np.int32))
    assert len(set(zeros)) == 4
    assert set(zeros).isdisjoint(keys(np.ones(256, np.int32)))


# --- bursts of groups ---------------------------------------------------------------------------------

@pytest.mark.parametrize("num_replicas", [2, 4, 8])
def test_a_burst_of_groups_keeps_each_group_on_one_replica(num_replicas):
    run = replay(num_replicas, concurrency=None)
    assert run.extra_replicas <= 2, run.replicas_of_group
    groups_per_replica = [sum(r in reps for reps in run.replicas_of_group.values())
                          for r in range(num_replicas)]
    assert min(groups_per_replica) >= GROUPS // num_replicas - 2, groups_per_replica


@pytest.mark.parametrize("num_replicas", [2, 4, 8])
@pytest.mark.parametrize("concurrency", [None, 128])
def test_simulated_hit_rate_within_2_points_of_one_replica(num_replicas, concurrency):
    one = replay(1, concurrency)
    ideal = GROUPS * (PER_GROUP - 1) * SYSTEM_LEN / (GROUPS * PER_GROUP * (SYSTEM_LEN + QUESTION_LEN))
    assert one.hit_rate == pytest.approx(ideal)
    for seed in range(3):
        many = replay(num_replicas, concurrency, seed)
        assert many.hit_rate >= one.hit_rate - 0.02, (seed, many.hit_rate, many.replicas_of_group)


@pytest.mark.parametrize("num_replicas", [2, 4, 8])
def test_loads_stay_within_w_prompts_plus_an_output_while_a_burst_arrives(num_replicas):
    run = Replay(num_replicas)
    rng = np.random.default_rng(5)
    for group, prompt in shared_prefix_burst(3):
        run.route(group, prompt)
        # and unrelated prompts of any length in between
        run.route(-1, rng.integers(0, 151_000, int(rng.integers(1, 6000)), dtype=np.int32))
    assert 0 < run.max_gap <= run.gap_bound, (run.max_gap, run.gap_bound)


def test_finished_requests_leave_no_record_and_no_load():
    run = replay(4, concurrency=128)
    while run.in_flight:
        run.finish_oldest()
    assert run.router.load_tokens == [0, 0, 0, 0]
    assert [run.router.routed_prefixes.num_keys(r) for r in range(4)] == [0, 0, 0, 0]


# --- load, cache, failure -------------------------------------------------------------------------------

def test_unrelated_prompts_spread_evenly_by_load():
    router = DPRouter(4, BS)
    rng = np.random.default_rng(2)
    for i in range(100):
        prompt = rng.integers(0, 151_000, 500, dtype=np.int32)
        router.assign(f"r{i}", router.pick([0, 1, 2, 3], prompt, MAX_TOKENS, lambda r: 0))
    assert router.load_tokens == [25 * 564] * 4


def test_a_group_follows_its_first_prompt_until_the_load_there_outweighs_w_times_the_prefix():
    rng = np.random.default_rng(3)
    system = rng.integers(0, 151_000, SYSTEM_LEN, dtype=np.int32)
    def member():
        return np.concatenate([system, rng.integers(0, 151_000, QUESTION_LEN, dtype=np.int32)])
    # replica 0 wins while 2,240 + extra + 2,240 - W x 2,048 <= 2,240
    limit = SHARED_PREFIX_WEIGHT * SYSTEM_LEN - (SYSTEM_LEN + QUESTION_LEN + MAX_TOKENS)
    for extra_load, expected in [(limit - 1_000, 0), (limit + 1_000, 1)]:
        router = DPRouter(2, BS)
        first = router.pick([0, 1], member(), MAX_TOKENS, lambda r: 0)
        assert first.replica == 0 and first.work == SYSTEM_LEN + QUESTION_LEN + MAX_TOKENS
        router.assign("first", first)
        router.assign("other work", Route(0, extra_load, 0, []))
        # replica 0: load 2,240 + extra, work 192, shared 2,048; replica 1: load 0, work 2,240
        second = router.pick([0, 1], member(), MAX_TOKENS, lambda r: 0)
        assert second.replica == expected, (extra_load, second)
        if expected == 0:
            assert second.work == QUESTION_LEN + MAX_TOKENS and second.cached_len == 0


def test_a_cached_prefix_draws_the_request_like_a_routed_one():
    router = DPRouter(3, BS)
    prompt = np.arange(2176, dtype=np.int32)
    route = router.pick([0, 1, 2], prompt, MAX_TOKENS, lambda r: 2048 if r == 2 else 0)
    assert route == Route(2, 128 + MAX_TOKENS, 2048, route.prefix_keys)


def test_a_dead_replica_is_forgotten():
    router = DPRouter(2, BS)
    group = shared_prefix_burst(groups=1)
    first = router.pick([0, 1], group[0][1], MAX_TOKENS, lambda r: 0)
    router.assign("a", first)
    dead, alive = first.replica, 1 - first.replica
    assert router.routed_prefixes.num_keys(dead) == SYSTEM_LEN // 64 + 2
    router.forget_replica(dead)
    assert router.routed_prefixes.num_keys(dead) == 0
    # the group's next prompt has nowhere to share its prefix: it starts over on the live replica
    second = router.pick([alive], group[1][1], MAX_TOKENS, lambda r: 0)
    assert second.replica == alive and second.work == SYSTEM_LEN + QUESTION_LEN + MAX_TOKENS
    router.assign("b", second)
    assert router.release("a") == dead  # its request, moved elsewhere, lets go of the dead replica
    assert router.load_tokens[dead] == 0
    with pytest.raises(ValueError, match="replica .* is down"):
        router.assign("c", Route(dead, 1, 0, [1]))
    assert router.pick([], group[2][1], MAX_TOKENS, lambda r: 0) is None


def test_the_routing_cost_benchmark_times_every_request():
    result = measure(replicas=2, requests=64, prompt_len=300, in_flight=16)
    assert result["requests"] == 64
    assert 0 < result["route_us_median"] <= result["route_us_p99"]
