"""`python -m benchmarks.load`: drive a running Cadence server and report its latency and throughput.

    cadence serve --model qwen3-14b --load-format dummy &
    python -m benchmarks.load --dataset random --num-prompts 1000 --input-len 1784 --output-len 256 \\
        --max-concurrency 302 --out c302.json --plots plots/

Requests arrive at --request-rate per second (gamma-distributed gaps, --burstiness 1 = Poisson;
inf = all at once), at most --max-concurrency in flight. Every request streams; the report has
TTFT (time to the first token), TPOT (time per output token after the first), ITL (gaps between
chunks) and end-to-end latency as mean/median/p90/p99/max, token throughputs, the prefix-cache hit
rate over the run (from the server's counters), KV-cache usage sampled during the run, and the GPU's
idle share between back-to-back steps (the executors' wait for the next plan against their time
running steps, from the server's counters; key `step_wait`).
`--endpoint responses|messages` sends the same load through OpenAI's Responses API or Anthropic's
Messages API instead of /v1/completions and /v1/chat/completions (benchmarks/lib/http_endpoints.py).
Warm-up requests run first and are left out of every figure; `--flush-cache` then empties the
server's prefix cache, so a repeated run starts as cold as the first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time

from benchmarks.lib.backends import (
    SAMPLING_MODES,
    HttpBackend,
    Sampling,
    ZmqBackend,
)
from benchmarks.lib.datasets import (
    RequestSpec,
    multi_turn_dataset,
    random_dataset,
    shared_prefix_dataset,
)
from benchmarks.lib.http_endpoints import ENDPOINTS
from benchmarks.lib.load_run import LoadRun
from benchmarks.lib.load_summary import print_table, summarize, write_plots
from benchmarks.lib.structured_load import KINDS, correctness

# The scheduler reports its counters every 0.2 s; a sample this long after the run includes it all.
_COUNTERS_SETTLE_S = 0.5


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--base-url",
        default="http://127.0.0.1:8000",
        help="the server's HTTP address (http backend; default %(default)s)",
    )
    p.add_argument(
        "--backend",
        choices=("http", "zmq"),
        default="http",
        help="http: the OpenAI API; zmq: the native client on --zmq-address (default http)",
    )
    p.add_argument(
        "--endpoint",
        choices=ENDPOINTS,
        default="openai",
        help="http backend: openai (/v1/completions, /v1/chat/completions for multi-turn), responses "
        "(/v1/responses) or messages (/v1/messages); the last two send prompts as text (default openai)",
    )
    p.add_argument("--zmq-address", help="the tokenizer's ZeroMQ address, printed by the server at start")
    p.add_argument("--api-key", help="sent as 'Authorization: Bearer <key>' (http backend)")
    p.add_argument(
        "--text-prompts",
        action="store_true",
        help="send the random and shared-prefix prompts as text, one word per token id (http backend; "
        "for routers that refuse token-id prompts, such as the SGLang Model Gateway)",
    )
    p.add_argument(
        "--dataset",
        choices=("random", "shared-prefix", "multi-turn"),
        default="random",
        help="the workload (default random)",
    )
    p.add_argument(
        "--num-prompts",
        type=int,
        default=100,
        help="requests to send, warm-up excluded (random; default %(default)s)",
    )
    p.add_argument("--input-len", type=int, default=1024, help="prompt tokens (random; default %(default)s)")
    p.add_argument(
        "--output-len",
        type=int,
        default=128,
        help="tokens each request asks for, with ignore_eos (every dataset; default %(default)s)",
    )
    p.add_argument(
        "--range-ratio",
        type=float,
        default=0.0,
        help="random: lengths drawn uniformly within +- this fraction (default 0: exact)",
    )
    p.add_argument(
        "--groups", type=int, default=64, help="shared-prefix: system prompts (default %(default)s)"
    )
    p.add_argument(
        "--prompts-per-group",
        type=int,
        default=16,
        help="shared-prefix: questions per system prompt (default %(default)s)",
    )
    p.add_argument(
        "--system-len",
        type=int,
        default=2048,
        help="shared-prefix: tokens of each system prompt (default %(default)s)",
    )
    p.add_argument(
        "--question-len",
        type=int,
        default=128,
        help="shared-prefix: tokens of each question (default %(default)s)",
    )
    p.add_argument(
        "--conversations", type=int, default=32, help="multi-turn: conversations (default %(default)s)"
    )
    p.add_argument("--turns", type=int, default=4, help="multi-turn: user turns each (default %(default)s)")
    p.add_argument(
        "--block-size",
        type=int,
        default=16,
        help="the server's KV page size, for the ideal shared-prefix hit rate (default %(default)s)",
    )
    p.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="requests (multi-turn: conversations) per second; inf sends all at once (default)",
    )
    p.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of the arrival gaps: 1 = Poisson, < 1 burstier, > 1 steadier",
    )
    p.add_argument(
        "--max-concurrency", type=int, default=None, help="requests in flight at most (default: no limit)"
    )
    p.add_argument(
        "--sampling",
        choices=SAMPLING_MODES,
        default="greedy",
        help="greedy (temperature 0), or model-defaults: send no sampling field, so the server applies "
        "the checkpoint's generation_config as it does for users (http backend; default greedy)",
    )
    p.add_argument("--extra-body", type=json.loads, default=None,
                   help="a JSON object merged into every request body, as vLLM's bench has it, e.g. "
                   "'{\"response_format\": {\"type\": \"json_object\"}}' (http backend)")
    p.add_argument("--structured", choices=sorted(KINDS), default=None,
                   help="every request constrained as vLLM's structured-output benchmark does (json, a "
                   "GBNF grammar, a regex or a choice); the report counts the replies that conform "
                   "(benchmarks/lib/structured_load.py; http backend)")
    p.add_argument("--temperature", type=float, help="sent with every request (overrides --sampling's)")
    p.add_argument("--top-p", type=float, help="sent with every request")
    p.add_argument("--top-k", type=int, help="sent with every request")
    p.add_argument("--warmup", type=int, default=2, help="requests sent and discarded first (default 2)")
    p.add_argument("--flush-cache", action="store_true",
                   help="empty the server's prefix cache after the warm-up, so the run starts cold "
                        "(POST /flush_cache, as SGLang's bench_serving --flush-cache; FlushCache on zmq)")
    p.add_argument("--seed", type=int, default=0, help="dataset and arrivals (default 0)")
    p.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds one request may take (default 3600)"
    )
    p.add_argument("--out", help="write the whole result as JSON to this path")
    p.add_argument("--plots", help="write PNG plots (latency CDFs, throughput and KV usage over time) here")
    p.add_argument("--label", default="", help="a name for this run in the JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def build_dataset(args: argparse.Namespace) -> list[RequestSpec]:
    if args.dataset == "random":
        return random_dataset(args.num_prompts, args.input_len, args.output_len, args.range_ratio, args.seed)
    if args.dataset == "shared-prefix":
        return shared_prefix_dataset(
            args.groups,
            args.prompts_per_group,
            args.system_len,
            args.question_len,
            args.output_len,
            args.seed,
        )
    return multi_turn_dataset(args.conversations, args.turns, 12, args.output_len, args.seed)


def sampling_of(args: argparse.Namespace) -> Sampling:
    return Sampling(args.sampling, args.temperature, args.top_p, args.top_k)


async def main_async(args: argparse.Namespace) -> dict:
    if args.extra_body is not None and not isinstance(args.extra_body, dict):
        raise SystemExit("--extra-body must be a JSON object")
    if args.structured:
        args.extra_body = {**(args.extra_body or {}), **KINDS[args.structured][0]}
    if args.structured and args.endpoint != "openai":
        raise SystemExit("--structured sends the OpenAI API's response_format: it needs --endpoint openai")
    if args.backend == "zmq":
        if args.endpoint != "openai":
            raise SystemExit("--endpoint is for the http backend (the native client has one way in)")
        if args.extra_body:
            raise SystemExit("--extra-body is for the http backend (the native client takes SamplingParams)")
        if not args.zmq_address:
            raise SystemExit("--backend zmq needs --zmq-address (the server prints it at start)")
        try:
            backend = ZmqBackend(args.zmq_address, args.timeout, sampling_of(args))
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
    else:
        backend = HttpBackend(args.base_url, args.api_key, args.timeout, sampling_of(args), args.text_prompts,
                              args.extra_body, args.endpoint)
    await backend.start()
    try:
        specs = build_dataset(args)
        warm = LoadRun(args, backend)
        warmup = random_dataset(args.warmup, 16, 4, 0.0, args.seed + 99) if args.warmup else []
        await asyncio.gather(*(warm.send(s) for s in warmup))
        if args.flush_cache and (why_not := await backend.flush_cache()) is not None:
            raise SystemExit(f"--flush-cache: the server did not flush its prefix cache: {why_not}")
        run = LoadRun(args, backend)
        if not args.no_progress:
            from tqdm import tqdm

            run.progress = tqdm(total=len(specs), desc=f"{args.dataset} load", file=sys.stderr)
        await asyncio.sleep(_COUNTERS_SETTLE_S)  # the counters include the warm-up
        before = await backend.gauges()
        start = time.perf_counter()
        duration = await run.run(specs)
        if run.progress is not None:
            run.progress.close()
        await asyncio.sleep(_COUNTERS_SETTLE_S)  # the server's counters include the last requests
        final = await backend.gauges()
        if final is not None:
            run.gauges.append((time.perf_counter(), final))
        result = summarize(run, duration, args, before, start)
        result["flushed_cache"] = args.flush_cache
        if args.structured:
            result["structured"] = correctness(args.structured, [t.text for _, t in run.timings if t.ok])
        return result
    finally:
        await backend.close()


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    result = asyncio.run(main_async(args))
    print_table(result)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if args.plots:
        for path in write_plots(result, args.plots):
            print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
