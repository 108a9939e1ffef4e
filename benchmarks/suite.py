"""The performance suite: start `cadence serve` per server setting, run the load tool against it,
and keep every run's JSON (with the exact commands) for `python -m benchmarks.report`.

    python -m benchmarks.suite --model qwen3-14b --out-dir results/ \
        --runs c1,c16,c64,c302,prefix_on,prefix_off
    python -m benchmarks.suite --runs peer --out-dir results/      # transformers on the same workload

Runs (the performance report's keys):
  chat                 one conversation of two chat turns through /v1/chat/completions, 128 tokens each
  c1, c16, c64, c302   random 1,784 in / 256 out at that concurrency (c302: 1,000 prompts)
  c1_sync, c302_sync   c1 and c302 one step at a time (--no-async-scheduling)
  c1_defaults,         c1 and c302 sampled at the checkpoint's defaults (--sampling model-defaults)
  c302_defaults
  c128_warm,           1,024 in / 256 out at concurrency 128, 256 prompts: c128_warm puts them in the
  c128_cached(_defaults) prefix cache, then the pair decodes them greedy and at the defaults
  prefix_on/off        shared-prefix: 64 groups x 16 prompts, 2,048-token system, 128 question, 256 out,
                       with the prefix cache on and off
  prefix_on_sync       prefix_on's prompts one step at a time (--no-async-scheduling)
  dp2                  c302's request shape, 500 prompts, two replicas sharing the card (--dp 2)
  prefix_burst_dp1,    a burst of groups: 32 groups x 16 prompts, 2,048-token system, 128 question,
  prefix_burst_dp2     64 out, at concurrency 128 sent at once, on one replica and on two sharing the
                       card (the DP router's prefix locality: compare their prefix hit rates)
  peer_cadence, peer   256 x 512 in / 128 out through Cadence, and through transformers' generate_batch
  c1_fp8, c302_fp8,    c1, c302, prefix_on and peer_cadence's prompts on a server quantized to FP8 at
  prefix_on_fp8,       load (--quantization fp8: 128 x 128 block-scaled weights, 1 x 128 dynamic
  peer_cadence_fp8     activation groups), for the bf16 and FP8 rows side by side
--scale shrinks every workload's prompt count (for a quick look; the report says so).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

RANDOM = ["--dataset", "random", "--input-len", "1784", "--output-len", "256"]
# Decode-bound: 1,024-token prompts that c128_warm has put in the prefix cache, 256 tokens out.
CACHED = ["--dataset", "random", "--input-len", "1024", "--output-len", "256", "--max-concurrency", "128"]
SHARED = [
    "--dataset",
    "shared-prefix",
    "--groups",
    "64",
    "--prompts-per-group",
    "16",
    "--system-len",
    "2048",
    "--question-len",
    "128",
    "--output-len",
    "256",
]
# Every group's prompts arrive before any of them is cached: what the DP router must keep together.
SHARED_BURST = ["--dataset", "shared-prefix", "--groups", "32", "--prompts-per-group", "16", "--system-len",
                "2048", "--question-len", "128", "--output-len", "64", "--max-concurrency", "128"]
FP8 = ("--quantization", "fp8")
PEER_WORKLOAD = ["--dataset", "random", "--input-len", "512", "--output-len", "128", "--num-prompts", "256"]


@dataclass(frozen=True)
class Run:
    key: str
    server_flags: tuple[str, ...]  # beyond --model/--load-format
    load_flags: tuple[str, ...]
    num_prompts: int  # before --scale
    prompts_of: str = ""  # another run whose prompts (seed) this one repeats, for a like-for-like pair


RUNS = {
    "chat": Run("chat", (), ("--dataset", "multi-turn", "--conversations", "1", "--turns", "2",
                             "--output-len", "128"), 2),
    "c1": Run("c1", (), (*RANDOM, "--max-concurrency", "1"), 16),
    "c16": Run("c16", (), (*RANDOM, "--max-concurrency", "16"), 128),
    "c64": Run("c64", (), (*RANDOM, "--max-concurrency", "64"), 320),
    "c302": Run("c302", (), (*RANDOM, "--max-concurrency", "302"), 1000),
    "prefix_on": Run("prefix_on", (), (*SHARED, "--max-concurrency", "256"), 1024),
    "prefix_off": Run(
        "prefix_off", ("--no-enable-prefix-caching",), (*SHARED, "--max-concurrency", "256"), 1024
    ),
    # Two replicas on one card only show the router and the replicas' overhead (DP is for several
    # cards): half of c302's prompts keep the run short.
    "dp2": Run("dp2", ("--dp", "2"), (*RANDOM, "--max-concurrency", "302"), 500),
    "prefix_burst_dp1": Run("prefix_burst_dp1", (), tuple(SHARED_BURST), 512),
    "prefix_burst_dp2": Run("prefix_burst_dp2", ("--dp", "2"), tuple(SHARED_BURST), 512, "prefix_burst_dp1"),
    "peer_cadence": Run("peer_cadence", (), PEER_WORKLOAD, 256),
    # The same prompts as c1 and c302, one step at a time (each on a server of its own).
    "c1_sync": Run("c1_sync", ("--no-async-scheduling",), (*RANDOM, "--max-concurrency", "1"), 16, "c1"),
    "prefix_on_sync": Run("prefix_on_sync", ("--no-async-scheduling",), (*SHARED, "--max-concurrency", "256"),
                          1024, "prefix_on"),
    "c302_sync": Run("c302_sync", ("--no-async-scheduling",), (*RANDOM, "--max-concurrency", "302"), 1000,
                     "c302"),
    # The same prompts sampled as users do: no sampling field, so the server applies the checkpoint's
    # generation_config (Qwen3: temperature 0.6, top_p 0.95, top_k 20).
    "c1_defaults": Run("c1_defaults", (), (*RANDOM, "--max-concurrency", "1", "--sampling", "model-defaults"),
                       16, "c1"),
    "c302_defaults": Run("c302_defaults", (), (*RANDOM, "--max-concurrency", "302", "--sampling",
                                               "model-defaults"), 1000, "c302"),
    # The sampler's cost where decode dominates: the same cached prompts, greedy and at the defaults.
    "c128_warm": Run("c128_warm", (), tuple(CACHED), 256),
    "c128_cached": Run("c128_cached", (), tuple(CACHED), 256, "c128_warm"),
    "c128_cached_defaults": Run("c128_cached_defaults", (), (*CACHED, "--sampling", "model-defaults"), 256,
                                "c128_warm"),
    # The same prompts served in FP8 (weights quantized at load), beside their bf16 runs.
    "c1_fp8": Run("c1_fp8", FP8, (*RANDOM, "--max-concurrency", "1"), 16, "c1"),
    "c302_fp8": Run("c302_fp8", FP8, (*RANDOM, "--max-concurrency", "302"), 1000, "c302"),
    "prefix_on_fp8": Run("prefix_on_fp8", FP8, (*SHARED, "--max-concurrency", "256"), 1024, "prefix_on"),
    "peer_cadence_fp8": Run("peer_cadence_fp8", FP8, PEER_WORKLOAD, 256, "peer_cadence"),
}


def _load_flags(run: Run, scale: float) -> list[str]:
    flags = list(run.load_flags)
    count = max(1, round(run.num_prompts * scale))
    if "--groups" in flags:  # shared-prefix: scale the groups, keep the prompts per group
        at = flags.index("--groups") + 1
        flags[at] = str(max(1, round(int(flags[at]) * scale)))
    elif "--num-prompts" in flags:
        flags[flags.index("--num-prompts") + 1] = str(count)
    else:
        flags += ["--num-prompts", str(count)]
    return flags


class Server:
    """`cadence serve` in a subprocess, healthy before use, stopped with SIGINT."""

    def __init__(self, flags: list[str], port: int, log_path: str, startup_s: float) -> None:
        self.command = [sys.executable, "-m", "api", "serve", "--port", str(port), *flags]
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + startup_s
        while not self._healthy():
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}; see {log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server was not healthy within {startup_s} s; see {log_path}")
            time.sleep(1.0)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.suite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model", default="qwen3-14b", help="served with --load-format dummy (default %(default)s)"
    )
    p.add_argument(
        "--runs", default="c1,c16,c64,c302", help=f"comma-separated, of {', '.join([*RUNS, 'peer'])}"
    )
    p.add_argument("--out-dir", required=True, help="one JSON per run, plus server logs")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every workload's size (default 1)")
    p.add_argument("--port", type=int, default=8321, help="the server's port (default %(default)s)")
    p.add_argument("--server-flags", default="", help="extra flags for every cadence serve, quoted")
    p.add_argument("--startup-timeout", type=float, default=900, help="seconds for a server to get healthy")
    args = p.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    base = ["--model", args.model, "--load-format", "dummy", *shlex.split(args.server_flags)]
    keys = [k for k in args.runs.split(",") if k]
    unknown = [k for k in keys if k not in RUNS and k != "peer"]
    if unknown:
        raise SystemExit(f"unknown run(s) {unknown}; choose from {', '.join([*RUNS, 'peer'])}")
    server, server_flags = None, None
    try:
        for key in keys:
            if key == "peer":
                continue
            run = RUNS[key]
            flags = [*base, *run.server_flags]
            if flags != server_flags:
                if server is not None:
                    server.stop()
                server = Server(
                    flags, args.port, os.path.join(args.out_dir, f"server_{key}.log"), args.startup_timeout
                )
                server_flags = flags
            # Each run its own prompts (--seed): one run's prompts are no cache hits for the next.
            load = ["--base-url", server.url, *_load_flags(run, args.scale), "--label", key, "--no-progress",
                    "--seed", str(list(RUNS).index(run.prompts_of or key)),
                    "--out", os.path.join(args.out_dir, f"{key}.json")]
            print(
                f"[suite] {key}: cadence serve {shlex.join(flags)} ; python -m benchmarks.load "
                f"{shlex.join(load)}",
                flush=True,
            )
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "benchmarks.load", *load], check=False)
            _annotate(
                os.path.join(args.out_dir, f"{key}.json"),
                flags,
                load,
                args.scale,
                time.perf_counter() - started,
            )
    finally:
        if server is not None:
            server.stop()
    if "peer" in keys:
        out = os.path.join(args.out_dir, "peer.json")
        count = max(1, round(256 * args.scale))
        peer = [
            "--model",
            args.model,
            "--num-prompts",
            str(count),
            "--input-len",
            "512",
            "--output-len",
            "128",
            "--out",
            out,
        ]
        print(f"[suite] peer: python -m benchmarks.peer_hf {shlex.join(peer)}", flush=True)
        subprocess.run([sys.executable, "-m", "benchmarks.peer_hf", *peer], check=False)


def _annotate(path: str, server_flags: list[str], load_flags: list[str], scale: float, wall_s: float) -> None:
    """Write the commands that made a result into it, so the report can name them."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        result = json.load(f)
    result["server_command"] = f"cadence serve {shlex.join(server_flags)}"
    result["load_command"] = f"python -m benchmarks.load {shlex.join(load_flags)}"
    result["scale"] = scale
    result["wall_s"] = wall_s
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
