"""What the DP router costs per request, on this machine's CPU.

    python -m benchmarks.dp_routing --replicas 8 --requests 10000 --prompt-len 2048

Requests come in groups of 16 that share all but their last 128 tokens, in shuffled order; at most
`--in-flight` are routed and unfinished at a time (the oldest finishes first). Every replica has a
real radix tree, and half the groups' prefixes are in one replica's tree beforehand, so the
router's peek at each tree walks real pages. Timed per request: pick (peeks included), assign and,
once the window is full, the release of the oldest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import deque

import numpy as np

from core.scheduling.block_pool import BlockPool
from core.scheduling.dp_router import DPRouter
from core.scheduling.radix_cache import RadixCache

_GROUP_SIZE = 16
_OWN_TOKENS = 128


def measure(replicas: int, requests: int, prompt_len: int, in_flight: int, block_size: int = 16,
            seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    num_groups = -(-requests // _GROUP_SIZE)
    shared_len = max(prompt_len - _OWN_TOKENS, 0)
    prefixes = rng.integers(0, 150_000, (num_groups, shared_len), dtype=np.int32)
    order = rng.permutation(num_groups * _GROUP_SIZE)[:requests] // _GROUP_SIZE
    own_len = prompt_len - shared_len
    prompts = [np.concatenate([prefixes[g], rng.integers(0, 150_000, own_len, dtype=np.int32)])
               for g in order]

    pages_per_prefix = shared_len // block_size
    caches = []
    for replica in range(replicas):
        pool = BlockPool(num_groups * pages_per_prefix // max(replicas, 1) + pages_per_prefix + 1)
        cache = RadixCache(pool, block_size)
        for group in range(replica, num_groups // 2, replicas):  # half the groups are cached somewhere
            pages = pool.allocate(pages_per_prefix)
            cache.insert(prefixes[group][: pages_per_prefix * block_size], pages)
            pool.decref(pages)
        caches.append(cache)

    router = DPRouter(replicas, block_size)
    live = list(range(replicas))
    window: deque[str] = deque()
    times = []
    for index, prompt in enumerate(prompts):
        request_id = f"r{index}"
        start = time.perf_counter()
        route = router.pick(live, prompt, 64, lambda r, p=prompt: caches[r].peek(p))
        router.assign(request_id, route)
        window.append(request_id)
        if len(window) > in_flight:
            router.release(window.popleft())
        times.append(time.perf_counter() - start)
    return {
        "replicas": replicas,
        "requests": requests,
        "prompt_len": prompt_len,
        "in_flight": in_flight,
        "route_us_median": statistics.median(times) * 1e6,
        "route_us_mean": statistics.fmean(times) * 1e6,
        "route_us_p99": sorted(times)[int(0.99 * (len(times) - 1))] * 1e6,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dp_routing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--prompt-len", type=int, default=2048)
    p.add_argument("--in-flight", type=int, default=256, help="routed and unfinished at most (default 256)")
    p.add_argument("--out", help="write the result as JSON here too")
    args = p.parse_args(argv)
    result = measure(args.replicas, args.requests, args.prompt_len, args.in_flight)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
