"""What one arriving request costs the host before it can join a step.

    python -m benchmarks.arrivals --prompt-len 2176 --burst 64

A burst of new requests goes through the tokenizer process (encode), the wire (encode and decode
of a TokenizedRequest) and the scheduler (a Request, the DP router's prefix peek, admission). The
tokenizer encodes a burst on encoder threads when its tokenizer allows it; the scheduler takes
inputs for at most 5 ms a loop turn. This times each part on this machine's CPU with the built-in
Qwen3 vocabulary and random token ids as text, so a change to any of them can be measured before
and after (benchmarks/NOTES.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from core.config import CacheConfig, SchedulerConfig
from core.sampling_params import SamplingParams
from core.scheduling.request import Request
from core.scheduling.scheduler import Scheduler
from core.tokenizer import load_tokenizer
from ipc.codec import decode, encode
from ipc.messages import TokenizedRequest


def _median_us(fn, items) -> float:
    times = []
    for item in items:
        start = time.perf_counter()
        fn(item)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure(prompt_len: int, burst: int, threads: int, seed: int = 0) -> dict:
    tokenizer = load_tokenizer(None)
    rng = np.random.default_rng(seed)
    texts = [tokenizer.decode(rng.integers(0, 150_000, prompt_len).tolist()) for _ in range(burst)]
    token_ids = [tokenizer.encode(t) for t in texts]

    start = time.perf_counter()
    for text in texts:
        tokenizer.encode(text)
    serial_ms = (time.perf_counter() - start) * 1e3
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(tokenizer.encode, texts[:threads]))  # start the threads
        start = time.perf_counter()
        list(pool.map(tokenizer.encode, texts))
        threaded_ms = (time.perf_counter() - start) * 1e3

    params = SamplingParams(max_tokens=256)
    wires = [encode(TokenizedRequest(f"r{i}", ids, params, 0.0)) for i, ids in enumerate(token_ids)]
    messages = [decode(w) for w in wires]
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=max(256, burst)), CacheConfig(), num_pages=100_000,
                          max_model_len=40_960, eos_token_ids=(151645,))

    def admit(msg: TokenizedRequest) -> None:
        request = Request(msg.request_id, msg.prompt_token_ids, msg.params, arrival_s=msg.arrival_s)
        scheduler.cached_prefix_len(request.all_token_ids)
        scheduler.add_request(request)

    return {
        "prompt_tokens": int(np.mean([len(ids) for ids in token_ids])),
        "burst": burst,
        "threads": threads,
        "tokenize_burst_serial_ms": serial_ms,
        "tokenize_burst_threads_ms": threaded_ms,
        "wire_encode_us": _median_us(lambda ids: encode(TokenizedRequest("r", ids, params, 0.0)), token_ids),
        "wire_decode_us": _median_us(decode, wires),
        "scheduler_admit_us": _median_us(admit, messages),
        "wire_bytes": len(wires[0]),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.arrivals", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt-len", type=int, default=2176, help="token ids per prompt (default %(default)s)")
    p.add_argument("--burst", type=int, default=64, help="requests arriving together (default %(default)s)")
    p.add_argument("--threads", type=int, default=max(1, min(8, os.cpu_count() or 1)),
                   help="encoder threads, as the tokenizer process uses (default %(default)s)")
    p.add_argument("--out", help="also write the figures as JSON here")
    args = p.parse_args(argv)
    if args.prompt_len < 1 or args.burst < 1 or args.threads < 1:
        raise SystemExit("--prompt-len, --burst and --threads must be at least 1")
    r = measure(args.prompt_len, args.burst, args.threads)
    print(f"{r['burst']} requests of ~{r['prompt_tokens']} tokens, on {os.cpu_count()} CPU cores")
    print(f"  tokenize the burst, one thread     {r['tokenize_burst_serial_ms']:8.1f} ms")
    print(f"  tokenize the burst, {r['threads']} threads      {r['tokenize_burst_threads_ms']:8.1f} ms")
    print(f"  wire encode / decode, per request  {r['wire_encode_us']:8.0f} / {r['wire_decode_us']:.0f} us "
          f"({r['wire_bytes']:,} bytes)")
    print(f"  scheduler admission, per request   {r['scheduler_admit_us']:8.0f} us")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
