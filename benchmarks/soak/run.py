"""`python -m benchmarks.soak`: a long mixed load against a whole server; checks that nothing leaks.

    python -m benchmarks.soak --num-requests 20000 --concurrency 64 --server-arg=--dp --server-arg=2

It starts `python -m api serve --model qwen3-tiny --device cpu --max-model-len 1024` (--model and
--device change those; plus every --server-arg) on a free port, logging to --server-log, or soaks a
running one at --base-url. Over
HTTP it sends completions and chats (and one call in five through /v1/responses or /v1/messages,
judged by benchmarks/soak/agent_replies.py), streamed and whole, prompts of a few to ~600 tokens (a quarter
behind long shared prefixes, for the prefix cache), greedy and sampled (Qwen's 0.6 / 0.95, some
seeded), some n=2, some with stop strings. Of the requests 10 % are streams the client drops after
a chunk or two, and 5 % are bad requests the server must refuse with a 4xx error object.

Every request ends as one of: ok (the right number of choices, each with a finish_reason; a stream
ends with [DONE]), disconnected (by design), refused (a bad request answered 4xx), failed (5xx,
a wrong status or body, an error event, a broken stream) or lost (no answer at all within
--request-timeout). Then it checks the server holds nothing for them: per replica, no KV page
beyond the prefix cache, no routed load, nothing running or waiting (from server_info on the
tokenizer's native address); the RSS of every server process grew under 10 % after the warm-up
(a quarter of the calls, by when the prefix cache is full), judged along the least-squares line
through a sample every --progress-every calls, since one pair of samples is mostly the allocator's
swing; and, for a server it started, SIGINT leaves no process and no /dev/shm segment behind. The
result goes to --output as JSON; the exit status is 1 when a target is missed.

The calls are benchmarks/soak/workload.py's, judged by benchmarks/soak/calls.py; the server and
its processes are benchmarks/soak/server.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from benchmarks.soak.calls import Outcome, fire
from benchmarks.soak.server import ServerUnderTest, idle_pages, launcher_pid, rss_snapshot
from benchmarks.soak.workload import Shot, Workload

RSS_GROWTH_LIMIT_PCT = 10.0
_FAILURES_KEPT = 50



@dataclass
class Tally:
    counts: collections.Counter = field(default_factory=collections.Counter)
    by_shape: dict[str, collections.Counter] = field(default_factory=lambda: collections.defaultdict(
        collections.Counter))
    failures: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0

    def add(self, shot: Shot, outcome: Outcome) -> None:
        self.counts[outcome.category] += 1
        key = outcome.category if outcome.category != "refused" else f"refused {outcome.detail}"
        self.by_shape[f"{shot.kind}: {shot.label}"][key] += 1
        if outcome.category in ("failed", "lost") and len(self.failures) < _FAILURES_KEPT:
            self.failures.append(f"{outcome.category}: {outcome.detail}")
        if outcome.category == "ok":
            self.latencies_s.append(outcome.latency_s)
            self.completion_tokens += outcome.completion_tokens


async def soak(args: argparse.Namespace, base_url: str, workload: Workload,
               on_progress: Any) -> tuple[Tally, float]:
    """Every shot at `args.concurrency` in flight; calls on_progress(ended) after the warm-up's last
    call and every --progress-every calls."""
    import aiohttp

    tally = Tally()
    next_index = 0
    start = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=0)  # the workers decide the concurrency
    no_limit = aiohttp.ClientTimeout(total=None)  # fire() times each call itself
    async with aiohttp.ClientSession(connector=connector, timeout=no_limit) as session:

        async def worker() -> None:
            nonlocal next_index
            while next_index < args.num_requests:
                shot = workload.shot(next_index)
                next_index += 1
                tally.add(shot, await fire(session, base_url, shot, args.request_timeout))
                ended = sum(tally.counts.values())
                if ended == args.warmup or ended % args.progress_every == 0:
                    on_progress(ended)
                if ended % args.progress_every == 0 or ended == args.num_requests:
                    rate = ended / (time.perf_counter() - start)
                    print(f"soak: {ended}/{args.num_requests} ({rate:.2f}/s) {dict(tally.counts)}",
                          file=sys.stderr, flush=True)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return tally, time.perf_counter() - start


def two_point_growth(warm: dict[str, dict[str, Any]],
                     end: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Percent growth per process from the warm-up's sample to the end's; None for one that is not
    the same process at both ends. Reported, not judged: one pair of samples is mostly the
    allocator's swing (the executors' RSS moves by 20 % either way between two samples)."""
    growth: dict[str, float | None] = {}
    for name in sorted(set(warm) | set(end)):
        a, b = warm.get(name), end.get(name)
        same = a is not None and b is not None and a["pid"] == b["pid"]
        growth[name] = round(100 * (b["rss_mib"] - a["rss_mib"]) / a["rss_mib"], 2) if same else None
    return growth


def trend_growth(samples: list[dict[str, Any]], warmup: int,
                 same: dict[str, float | None]) -> dict[str, float | None]:
    """Percent growth per process over the samples from the warm-up on, along their least-squares
    line: a leak climbs with the calls served, noise around a level does not. None where the
    process changed (`same` has None) or fewer than three samples were taken."""
    steady = [x for x in samples if x["ended"] >= warmup]
    growth: dict[str, float | None] = {}
    for name, two_point in same.items():
        points = [(x["ended"], x["rss_mib"][name]) for x in steady if name in x["rss_mib"]]
        if two_point is None or len(points) < 3:
            growth[name] = None
            continue
        calls, rss = np.array(points, dtype=float).T
        slope, at_zero = np.polyfit(calls, rss, 1)
        start = at_zero + slope * calls[0]
        growth[name] = round(100 * slope * (calls[-1] - calls[0]) / start, 2)
    return growth


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=20000, help="HTTP calls in all (default %(default)s)")
    p.add_argument("--concurrency", type=int, default=64, help="calls in flight (default %(default)s)")
    p.add_argument("--warmup", type=int, default=None,
                   help="calls ended before RSS growth is judged (default: a quarter of them, by when the "
                        "prefix cache is full and the scheduler's tree has stopped growing)")
    p.add_argument("--max-tokens", type=int, default=24,
                   help="largest max_tokens asked (default %(default)s)")
    p.add_argument("--max-prompt-tokens", type=int, default=600,
                   help="longest prompt, about (default %(default)s)")
    p.add_argument("--request-timeout", type=float, default=120.0,
                   help="seconds a call may take; one with no answer by then is lost (default %(default)s)")
    p.add_argument("--idle-timeout", type=float, default=30.0,
                   help="seconds to wait for the engine to go idle after the last call (default %(default)s)")
    p.add_argument("--model", default="qwen3-tiny", help="the server's --model (default %(default)s)")
    p.add_argument("--device", default="cpu", help="the server's --device (default %(default)s)")
    p.add_argument("--server-arg", action="append", default=[],
                   help="one more argument for `api serve` (repeat; --server-arg=--dp --server-arg=2)")
    p.add_argument("--server-log", default=None,
                   help="the server's output (default /tmp/cadence-soak-<pid>.log)")
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for /health 200")
    p.add_argument("--base-url", help="soak this running server instead of starting one")
    p.add_argument("--tokenizer-address", help="with --base-url: its native address, for pages and RSS")
    p.add_argument("--seed", type=int, default=0, help="the workload (default %(default)s)")
    p.add_argument("--progress-every", type=int, default=500, help="calls between progress lines")
    p.add_argument("--rescore", metavar="RESULT_JSON",
                   help="judge a saved result's RSS samples again with this version's method; no run")
    p.add_argument("--output", default="docs/reports/soak_cpu.json",
                   help="the JSON result (default %(default)s)")
    return p


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def targets(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    counts = result["counts"]
    rows: dict[str, tuple[Any, str, bool]] = {
        "lost requests": (counts["lost"], "0", counts["lost"] == 0),
        "unexpected failures": (counts["failed"], "0", counts["failed"] == 0),
    }
    pages = result.get("pages")
    if pages is not None:
        reps = pages["replicas"]
        held = sum(r.get("held_beyond_cache", 0) for r in reps)
        load = sum(r["routed_load_tokens"] for r in reps)
        busy = sum(r.get("num_running", 0) + r.get("num_waiting", 0) for r in reps)
        rows["pages held beyond the cache"] = (held, "0", held == 0 and all("free" in r for r in reps))
        rows["router load tokens"] = (load, "0", load == 0)
        rows["running + waiting"] = (busy, "0", busy == 0)
        alive = sum(r["alive"] for r in reps)
        rows["replicas alive"] = (alive, str(len(reps)), alive == len(reps))
    growth = (result.get("rss") or {}).get("growth_pct")
    if growth is not None:
        worst = max((g for g in growth.values() if g is not None), default=0.0)
        same = all(g is not None for g in growth.values())
        rows["RSS growth (trend after the warm-up), worst process %"] = (worst, f"< {RSS_GROWTH_LIMIT_PCT:g}",
                                              same and worst < RSS_GROWTH_LIMIT_PCT)
    shutdown = result.get("shutdown")
    if shutdown is not None:
        rows["clean shutdown"] = (shutdown["clean"], "True", shutdown["clean"])
    return {k: {"value": v, "target": t, "passed": bool(ok)} for k, (v, t, ok) in rows.items()}


def print_summary(result: dict[str, Any]) -> None:
    c = result["counts"]
    print(f"\nsoak: {result['config']['num_requests']} calls in {result['duration_s']:.0f} s "
          f"({result['throughput_rps']:.2f}/s): ok {c['ok']}, disconnected {c['disconnected']}, "
          f"refused {c['refused']}, failed {c['failed']}, lost {c['lost']}")
    rss = result.get("rss") or {}
    if "growth_pct" in rss:
        print(f"{'process':<34}{'RSS warm MiB':>14}{'RSS end MiB':>13}{'2-point %':>11}{'trend %':>9}")
        for name, growth in rss["growth_pct"].items():
            warm, end = rss["warmup"].get(name, {}), rss["end"].get(name, {})
            two_point = rss["two_point_growth_pct"].get(name)
            print(f"{name:<34}{warm.get('rss_mib', '-'):>14}{end.get('rss_mib', '-'):>13}"
                  f"{'-' if two_point is None else two_point:>11}{'-' if growth is None else growth:>9}")
    for r in (result.get("pages") or {}).get("replicas", []):
        print(f"replica {r['replica']}: {r['num_pages']} pages, free {r.get('free')}, "
              f"cached {r.get('cached')}, "
              f"held beyond the cache {r.get('held_beyond_cache')}, router load {r['routed_load_tokens']}, "
              f"running {r.get('num_running')}, waiting {r.get('num_waiting')}")
    for name, t in result["targets"].items():
        print(f"{'PASS' if t['passed'] else 'FAIL'}  {name}: {t['value']} (target {t['target']})")
    for line in result["failures"][:10]:
        print(f"  {line}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.rescore:
        return rescore(args.rescore, args.warmup, args.output)
    if args.warmup is None:
        args.warmup = args.num_requests // 4
    server = None
    if args.base_url is None:
        log = args.server_log or f"/tmp/cadence-soak-{os.getpid()}.log"
        server = ServerUnderTest(args.model, args.server_arg, log, args.startup_timeout, args.device)
    try:
        if server is not None:
            server.start()
        result = _run(args, server)
    except BaseException:
        if server is not None:
            server.kill()
        raise
    result["command"] = " ".join(["python -m benchmarks.soak", *argv])
    if server is not None:
        result["shutdown"] = server.stop()
        result["server"]["log_tail"] = server.log_tail(15).splitlines()
    result["targets"] = targets(result)
    result["passed"] = all(t["passed"] for t in result["targets"].values())
    print_summary(result)
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)
    return result


def rescore(path: str, warmup: int | None, output: str | None) -> dict[str, Any]:
    """Judge a saved result's RSS samples again with this version's warm-up and trend (its requests,
    pages and shutdown stand as measured)."""
    with open(path) as f:
        result = json.load(f)
    rss = result["rss"]
    warmup = result["config"]["num_requests"] // 4 if warmup is None else warmup
    at_warmup = min((x for x in rss["samples"] if x["ended"] >= warmup), key=lambda x: x["ended"])
    first = rss["warmup"]  # the snapshot the run took; a process with another pid at the end changed
    rss["warmup"] = {name: {"pid": first.get(name, {}).get("pid"), "rss_mib": value}
                     for name, value in at_warmup["rss_mib"].items()}
    rss["two_point_growth_pct"] = two_point_growth(rss["warmup"], rss["end"])
    rss["growth_pct"] = trend_growth(rss["samples"], at_warmup["ended"], rss["two_point_growth_pct"])
    result["config"]["warmup"] = at_warmup["ended"]
    result["rescored"] = f"RSS judged again from call {at_warmup['ended']} along the trend"
    result["targets"] = targets(result)
    result["passed"] = all(t["passed"] for t in result["targets"].values())
    print_summary(result)
    if output:
        with open(output, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _run(args: argparse.Namespace, server: ServerUnderTest | None) -> dict[str, Any]:
    base_url = server.base_url if server is not None else args.base_url.rstrip("/")
    address = server.tokenizer_address if server is not None else args.tokenizer_address
    pid = server.process.pid if server is not None and server.process else launcher_pid(address or "")
    rss: dict[str, Any] = {"samples": []}
    start = time.monotonic()

    def on_progress(ended: int) -> None:
        if pid is None:
            return
        snapshot = rss_snapshot(pid)
        if ended == args.warmup:
            rss["warmup"] = snapshot
        # The trajectory tells a leak (steady climb) from allocator noise (swings around a level).
        rss["samples"].append({"ended": ended, "t_s": round(time.monotonic() - start, 1),
                               "rss_mib": {k: v["rss_mib"] for k, v in snapshot.items()}})
        if server is not None:
            server.remember_children()

    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=10) as response:
        model = orjson.loads(response.read())["data"][0]["id"]
    workload = Workload(model, args.seed, args.max_tokens, args.max_prompt_tokens)
    tally, duration_s = asyncio.run(soak(args, base_url, workload, on_progress))
    pages = idle_pages(address, args.idle_timeout) if address else None
    if pid is not None and "warmup" in rss:
        rss["end"] = rss_snapshot(pid)
        rss["two_point_growth_pct"] = two_point_growth(rss["warmup"], rss["end"])
        rss["growth_pct"] = trend_growth(rss["samples"], args.warmup, rss["two_point_growth_pct"])
    counts = {k: tally.counts[k] for k in ("ok", "disconnected", "refused", "failed", "lost")}
    latencies = tally.latencies_s
    return {
        "config": vars(args),
        "server": {"command": server.command if server else None, "base_url": base_url, "pid": pid,
                   "log": server.log_path if server else None, "tokenizer_address": address,
                   "startup_s": round(server.startup_s, 1) if server else None},
        "duration_s": round(duration_s, 1),
        "throughput_rps": round(args.num_requests / duration_s, 3),
        "completion_tokens": tally.completion_tokens,
        "counts": counts,
        "latency_ok_s": {"mean": round(sum(latencies) / max(len(latencies), 1), 3),
                         "p50": _percentile(latencies, 0.5), "p99": _percentile(latencies, 0.99),
                         "max": _percentile(latencies, 1.0)},
        "by_shape": {k: dict(v) for k, v in sorted(tally.by_shape.items())},
        "failures": tally.failures,
        "rss": rss if pid is not None else None,
        "pages": pages,
    }

