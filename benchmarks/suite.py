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
  dp2                  c302's request shape, 500 prompts, two replicas sharing one card (--dp 2 with
                       the first card alone visible)
  prefix_burst_dp1,    a burst of groups: 32 groups x 16 prompts, 2,048-token system, 128 question,
  prefix_burst_dp2     64 out, at concurrency 128 sent at once, on one replica and on two sharing one
                       card (the DP router's prefix locality: compare their prefix hit rates)
  prefix_burst_dp1_fp8, the burst pair in FP8 (room for the burst's KV cache on an 80 GB card)
  prefix_burst_dp2_fp8
  peer_cadence, peer   256 x 512 in / 128 out through Cadence, and through transformers' generate_batch
  c1_fp8, c302_fp8,    c1, c302, prefix_on and peer_cadence's prompts on a server quantized to FP8 at
  prefix_on_fp8,       load (--quantization fp8: 128 x 128 block-scaled weights, 1 x 128 dynamic
  peer_cadence_fp8     activation groups), for the bf16 and FP8 rows side by side
  c1_fp8_defaults,     c1 and c302 in FP8 sampled at the checkpoint's defaults
  c302_fp8_defaults
  c1_short(_fp8),      48 in / 64 out at concurrency 1, 64 prompts (TTFT bound by the host's launch of
  c1_short(_fp8)_graphs an eager step), in bf16 and FP8, and the same with --small-step-graphs
  c1_fp8_kvfp8, c302_fp8_kvfp8  c1 and c302 in FP8 with an fp8 KV cache (--kv-cache-dtype fp8)
  c1_json, c64_json    c1 and c64's prompts with every reply in JSON mode (response_format
                       json_object, through the load tool's --extra-body)
  c4, c4_fp8           random 1,784 in / 256 out at concurrency 4, 32 prompts, bf16 and FP8 (decode
                       steps of 2-4 rows)
On several cards (benchmarks/lib/layout_runs.py; `--runs multi-gpu` is c1, c302 and all of them),
one card per rank:
  tp2, tp4, tp8        c1 with --tp 2, 4, 8 (2, 4, 8 GPUs); tp2_c302: c302 with --tp 2 (2 GPUs)
  dp2_gpus, dp4_gpus,  c302's prompts x N at concurrency 302 x N with --dp N (N GPUs)
  dp8_gpus
  dp2tp2               --dp 2 --tp 2, c302's prompts x 2 at concurrency 604 (4 GPUs)
  tp2_kill, dp2_kill,  fault drills: SIGKILL of one executor under load (2, 2 and 4 GPUs)
  dp2tp2_kill
  matrix_multi_gpu     the generalization matrix's multi-gpu subset (2 GPUs and up)
A run that needs more GPUs than are visible is not run: the suite says so and goes on. --dry-run
prints every command (and what would not run here) without starting anything.
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

from benchmarks.lib.layout_runs import (
    ALL_REDUCE_PREFIX,
    LAYOUT_RUNS,
    MATRIX_KEY,
    MULTI_GPU_GROUP,
    LayoutRun,
    all_reduce_command,
    drill_command,
    is_command_run,
    matrix_command,
)
from benchmarks.lib.suite_runs import SINGLE_CARD_RUNS, Run

# Every server-and-load run: the multi-card load runs after the single-card ones (whose --seed, their
# index here, stays what it was); drills and the matrix start servers of their own.
RUNS = {**SINGLE_CARD_RUNS,
        **{k: Run(k, r.server_flags, r.load_flags, r.num_prompts, r.prompts_of)
           for k, r in LAYOUT_RUNS.items() if not is_command_run(r)}}
GROUPS = {"multi-gpu": list(MULTI_GPU_GROUP)}
ALL_KEYS = list(dict.fromkeys([*RUNS, "peer", *LAYOUT_RUNS]))


def gpus_needed(key: str) -> int:
    return LAYOUT_RUNS[key].gpus if key in LAYOUT_RUNS else 1


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

    def __init__(self, flags: list[str], port: int, log_path: str, startup_s: float,
                 env: dict[str, str] | None = None) -> None:
        self.command = [sys.executable, "-m", "api", "serve", "--port", str(port), *flags]
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})})
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
    p.add_argument("--runs", default="c1,c16,c64,c302",
                   help=f"comma-separated, of {', '.join(ALL_KEYS)}; or {', '.join(GROUPS)}")
    p.add_argument("--out-dir", required=True, help="one JSON per run, plus server logs")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every workload's size (default 1)")
    p.add_argument("--port", type=int, default=8321, help="the server's port (default %(default)s)")
    p.add_argument("--server-flags", default="", help="extra flags for every cadence serve, quoted")
    p.add_argument("--startup-timeout", type=float, default=900, help="seconds for a server to get healthy")
    p.add_argument("--dry-run", action="store_true",
                   help="print each run's commands, and which runs this machine has too few GPUs for; "
                        "start nothing")
    args = p.parse_args(argv)
    base = ["--model", args.model, "--load-format", "dummy", *shlex.split(args.server_flags)]
    keys = [k for group in args.runs.split(",") if group for k in GROUPS.get(group, [group])]
    unknown = [k for k in keys if k not in ALL_KEYS]
    if unknown:
        raise SystemExit(f"unknown run(s) {unknown}; choose from {', '.join(ALL_KEYS)}")
    if not args.dry_run:
        os.makedirs(args.out_dir, exist_ok=True)
    visible = _visible_gpus() if any(gpus_needed(k) > 1 for k in keys) else None
    server, server_flags = None, None
    seeds_served: set[int] = set()  # the prompts the running server has seen
    try:
        for key in keys:
            if key == "peer":
                continue
            needed = gpus_needed(key)
            if visible is not None and needed > 1 and needed > visible:
                print(f"[suite] {key}: not run: needs {needed} GPUs, {visible} visible", flush=True)
                if not args.dry_run:
                    continue
            layout = LAYOUT_RUNS.get(key)
            if layout is not None and key not in RUNS:  # a drill, the matrix, a sweep: a command of its own
                if server is not None:  # its cards must be free
                    server.stop()
                    server, server_flags = None, None
                _run_command(layout, [*base, *layout.server_flags], args)
                continue
            run = RUNS[key]
            flags = [*base, *run.server_flags]
            # Each run its own prompts (--seed): one run's prompts are no cache hits for the next.
            seed = list(RUNS).index(run.prompts_of or key)
            load = ["--base-url", f"http://127.0.0.1:{args.port}", *_load_flags(run, args.scale),
                    "--label", key, "--no-progress", "--seed", str(seed),
                    "--out", os.path.join(args.out_dir, f"{key}.json")]
            env = run_environment(run)
            print(f"[suite] {key}: {engine_environment(env)}cadence serve {shlex.join(flags)} ; "
                  f"python -m benchmarks.load {shlex.join(load)}", flush=True)
            if args.dry_run:
                continue
            if (flags, env) != server_flags or (seed in seeds_served and not run.expects_cache_hits):
                if server is not None:
                    server.stop()
                server = Server(flags, args.port, os.path.join(args.out_dir, f"server_{key}.log"),
                                args.startup_timeout, env)
                server_flags, seeds_served = (flags, env), set()
            seeds_served.add(seed)
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "benchmarks.load", *load], check=False)
            _annotate(os.path.join(args.out_dir, f"{key}.json"), engine_environment(env), flags, load,
                      args.scale, time.perf_counter() - started, needed)
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
        if not args.dry_run:
            subprocess.run([sys.executable, "-m", "benchmarks.peer_hf", *peer], check=False)


def _visible_gpus() -> int:
    """What the launcher will find (procs/devices.py); 0 on a machine without CUDA."""
    from procs.devices import visible_gpu_count

    return visible_gpu_count()


def _run_command(run: LayoutRun, serve_flags: list[str], args: argparse.Namespace) -> None:
    """A fault drill, the generalization matrix or an all-reduce sweep: a program of its own."""
    if run.key == MATRIX_KEY:
        command = matrix_command(args.model, args.out_dir)
    elif run.key.startswith(ALL_REDUCE_PREFIX):
        command = all_reduce_command(run, args.out_dir)
    else:
        command = drill_command(run, serve_flags, args.scale, args.out_dir)
    print(f"[suite] {run.key}: {shlex.join(['python', *command[1:]])}", flush=True)
    if args.dry_run:
        return
    started = time.perf_counter()
    subprocess.run(command, check=False)  # a drill exits 1 when requests failed: its JSON says which
    path = os.path.join(args.out_dir, f"{run.key}.json")
    if os.path.exists(path):
        with open(path) as f:
            result = json.load(f)
        result.update(suite_command=shlex.join(["python", *command[1:]]), gpus=run.gpus, scale=args.scale,
                      wall_s=time.perf_counter() - started)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


# Variables the servers inherit that change what a run measures (not CADENCE_API_KEY: a secret).
ENGINE_VARIABLES = ("CADENCE_FP8_GEMM", "CADENCE_INJECT_FAULT")


def run_environment(run: Run) -> dict[str, str]:
    """What a run's server gets on top of this process's environment: one card for `one_card` runs
    (the first of CUDA_VISIBLE_DEVICES where that is set)."""
    if not run.one_card:
        return {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    return {"CUDA_VISIBLE_DEVICES": visible}


def engine_environment(extra: dict[str, str] | None = None) -> str:
    """ENGINE_VARIABLES that are set (and `extra`), as the prefix of a command line: a run's recorded
    command names them."""
    variables = {key: os.environ[key] for key in ENGINE_VARIABLES if key in os.environ} | (extra or {})
    return "".join(f"{key}={shlex.quote(value)} " for key, value in variables.items())


def _annotate(path: str, environment: str, server_flags: list[str], load_flags: list[str], scale: float,
              wall_s: float, gpus: int) -> None:
    """Write the commands that made a result into it, so the report can name them."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        result = json.load(f)
    result["server_command"] = f"{environment}cadence serve {shlex.join(server_flags)}"
    result["load_command"] = f"python -m benchmarks.load {shlex.join(load_flags)}"
    result["scale"] = scale
    result["wall_s"] = wall_s
    result["gpus"] = gpus
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
