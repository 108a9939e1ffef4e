"""`python -m benchmarks.fault_drill`: kill one of a server's processes under load and report what
the clients saw.

    python -m benchmarks.fault_drill --kill "cadence:executor dp=1 tp=0" --kill-after 20 \\
        --serve="--model qwen3-14b --load-format dummy --dp 2" --out drill.json -- \\
        --dataset random --input-len 1024 --output-len 256 --max-concurrency 64 --num-prompts 200

Starts `cadence serve` with --serve's flags on a free port, waits for /health, runs the load tool's
workload (the flags after `--`, as `python -m benchmarks.load` takes them) and, --kill-after
seconds into it, sends SIGKILL to the server's process with that title. /health is asked every
0.5 s throughout. The report: requests completed and failed (and the errors), whether every
completed request got exactly the tokens it asked for, the requests in flight at the kill and how
long they took from the kill to their end (the moved ones, on a DP server), and /health over time.
Exits 1 when a request is lost or short (on a server with a replica left, every request must
complete), and ends with the reason when nothing was killed (no process of that title, or a load
that ended before --kill-after).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

import numpy as np

from benchmarks import load
from benchmarks.lib.backends import HttpBackend
from benchmarks.lib.load_run import LoadRun
from benchmarks.lib.processes import find_by_title

_HEALTH_EVERY_S = 0.5


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fault_drill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", default="", help="flags of `cadence serve` (one quoted string)")
    p.add_argument("--kill", default="cadence:executor dp=1 tp=0", help="title of the process to kill")
    p.add_argument("--kill-after", type=float, default=20.0, help="seconds into the load (default 20)")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--out", help="write the report as JSON here")
    p.add_argument("--server-log", default="fault_drill_server.log", help="the server's output")
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _health(session, base_url: str) -> int | str:
    try:
        async with session.get(f"{base_url}/health") as response:
            return response.status
    except Exception as exc:  # noqa: BLE001 - a refused or timed-out probe is a sample too
        return type(exc).__name__


async def _wait_healthy(session, base_url: str, server: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while await _health(session, base_url) != 200:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with code {server.returncode} before it was healthy")
        if time.monotonic() > deadline:
            raise SystemExit(f"the server was not healthy within {timeout_s:g} s")
        await asyncio.sleep(1.0)


async def drill(args: argparse.Namespace, load_args: argparse.Namespace) -> dict:
    import aiohttp

    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    load_args.base_url = base_url
    command = [sys.executable, "-m", "api", "serve", *shlex.split(args.serve), "--port", str(port)]
    with open(args.server_log, "w") as log_file:
        server = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    probe = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0))
    health: list[tuple[float, int | str]] = []
    killed: dict = {}
    try:
        await _wait_healthy(probe, base_url, server, args.startup_timeout)
        backend = HttpBackend(base_url, None, load_args.timeout, load.sampling_of(load_args))
        await backend.start()
        specs = load.build_dataset(load_args)
        run = LoadRun(load_args, backend)
        start = time.perf_counter()
        stop = asyncio.Event()

        async def watch_health() -> None:
            while not stop.is_set():
                health.append((time.perf_counter() - start, await _health(probe, base_url)))
                await asyncio.sleep(_HEALTH_EVERY_S)

        async def kill() -> None:
            await asyncio.sleep(args.kill_after)
            pid = find_by_title(server.pid, args.kill)
            os.kill(pid, signal.SIGKILL)
            killed.update(pid=pid, at_s=time.perf_counter() - start)

        watcher, killer = asyncio.create_task(watch_health()), asyncio.create_task(kill())
        try:
            duration = await run.run(specs)
        finally:
            await backend.close()
            stop.set()
            await watcher
            killer.cancel()
        if killer.done() and not killer.cancelled() and killer.exception() is not None:
            raise SystemExit(f"the drill killed nothing: {killer.exception()}")
        if not killed:
            raise SystemExit(f"the drill killed nothing: the load ended after {duration:.1f} s, before "
                             f"--kill-after {args.kill_after:g} s; give it more prompts or kill sooner")
        return _report(args, command, run, start, duration, killed, health)
    finally:
        await probe.close()
        try:  # a server whose scheduler or tokenizer was killed exits by itself, naming it
            server.wait(10 if killed else 0)
        except subprocess.TimeoutExpired:
            server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _report(args, command, run, start, duration, killed, health) -> dict:
    kill_s = killed.get("at_s")
    requests = [(spec, t) for spec, t in run.timings]
    ok = [(s, t) for s, t in requests if t.ok]
    short = [(s, t) for s, t in ok if t.output_tokens != s.output_len]
    moved = [t for _, t in requests if kill_s is not None and t.sent_s - start < kill_s
             and (t.done_s is None or t.done_s - start > kill_s)]
    after_kill = [t.done_s - start - kill_s for t in moved if t.ok]
    # Every stream in flight ends, completed or with an error event (a DP=1 server has no replica left).
    ended_after_kill = [t.done_s - start - kill_s for t in moved if t.done_s is not None]
    return {
        "command": " ".join(command),
        "kill": args.kill,
        "killed": killed,
        "duration_s": duration,
        "requests": len(requests),
        "completed": len(ok),
        "failed": len(requests) - len(ok),
        "errors": sorted({t.error or "no tokens" for _, t in requests if not t.ok})[:10],
        "short": len(short),
        "in_flight_at_kill": len(moved),
        "moved_completed": len(after_kill),
        "moved_end_after_kill_s": _percentiles(after_kill),
        "in_flight_ended": len(ended_after_kill),
        "in_flight_end_after_kill_s": _percentiles(ended_after_kill),
        "health": [[round(t, 2), status] for t, status in health],
        "health_not_200": [[round(t, 2), status] for t, status in health if status != 200],
    }


def _percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    a = np.asarray(values)
    return {"median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:split])
    load_args = load.build_parser().parse_args(argv[split + 1 :])
    report = asyncio.run(drill(args, load_args))
    summary = {k: v for k, v in report.items() if k not in ("health", "command")}
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if report["failed"] == 0 and report["short"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
