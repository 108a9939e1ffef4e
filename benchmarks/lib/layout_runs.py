"""The multi-card validation: the performance suite's runs that need several GPUs, one section of the
performance report per layout.

    python -m benchmarks.suite --runs multi-gpu --out-dir results/   # c1, c302 and every run below
                                                                     # that fits on this machine
    python -m benchmarks.suite --runs tp2,dp2_gpus,tp2_kill --dry-run --out-dir results/

Each run is a real `cadence serve` with one card per rank (procs/devices.py gives executor k the
card cuda:k), on Qwen3-14B with dummy weights unless --model says otherwise. A run needs `gpus`
visible GPUs; on a machine with fewer the suite prints "not run: needs N GPUs" and goes on, and
the report keeps that row as not run. Load runs repeat c1's or c302's prompts (the single-card
runs they are held against); DP runs send N times c302's prompts at N times its concurrency, so
that each replica sees c302's load. Drills (`kill`) go through benchmarks/fault_drill.py with the
Reliability section's workload; the matrix run is the generalization matrix's multi-gpu subset.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass

RANDOM = ("--dataset", "random", "--input-len", "1784", "--output-len", "256")
# The Reliability section's drills (docs/reports/performance_notes.md): 1,024 in / 256 out, 64 streams.
DRILL = ("--dataset", "random", "--input-len", "1024", "--output-len", "256", "--max-concurrency", "64")
MATRIX_KEY = "matrix_multi_gpu"
# Runs of benchmarks/all_reduce.py: the one-shot kernel against NCCL per message size, on N cards.
ALL_REDUCE_PREFIX = "allreduce_tp"


@dataclass(frozen=True)
class LayoutRun:
    key: str
    layout: str  # the report's section: "TP 2", "DP 2", "DP 2 x TP 2", ...
    gpus: int  # visible GPUs it needs, one per rank
    server_flags: tuple[str, ...]  # beyond --model/--load-format
    load_flags: tuple[str, ...]  # the load tool's workload, without --num-prompts
    num_prompts: int
    goal: str  # what the report holds the run against
    prompts_of: str = ""  # the single-card run whose prompts (seed) it repeats
    kill: str = ""  # a fault drill: SIGKILL the server's process with this title...
    kill_after_s: float = 20.0  # ...this long into the load


def _dp(n: int) -> LayoutRun:
    return LayoutRun(f"dp{n}_gpus", f"DP {n}", n, ("--dp", str(n)),
                     (*RANDOM, "--max-concurrency", str(302 * n)), 1000 * n,
                     f"total tok/s >= 0.95 x {n} x c302's (DP 1, one card of the same machine)", "c302")


def _tp(n: int, goal: str) -> LayoutRun:
    return LayoutRun(f"tp{n}", f"TP {n}", n, ("--tp", str(n)), (*RANDOM, "--max-concurrency", "1"), 16, goal,
                     "c1")


LAYOUT_RUNS = {run.key: run for run in (
    _tp(2, "c1 median TPOT <= 4.3 ms (TP 1 on one H200: 8.4 ms)"),
    LayoutRun("tp2_c302", "TP 2", 2, ("--tp", "2"), (*RANDOM, "--max-concurrency", "302"), 1000,
              "reported: TP 2's throughput, the baseline of DP 2 x TP 2", "c302"),
    _tp(4, "c1 median TPOT <= 3.0 ms"),
    _tp(8, "reported: c1 median TPOT"),
    _dp(2), _dp(4), _dp(8),
    LayoutRun("dp2tp2", "DP 2 x TP 2", 4, ("--dp", "2", "--tp", "2"),
              (*RANDOM, "--max-concurrency", "604"), 2000, "total tok/s >= 0.95 x 2 x tp2_c302's", "c302"),
    LayoutRun("tp2_kill", "TP 2", 2, ("--tp", "2"), DRILL, 200,
              "SIGKILL of executor dp=0 tp=1 15 s in: every stream in flight ends with an error naming it "
              "within seconds (its peer is not left waiting in an all-reduce), /health 503",
              kill="cadence:executor dp=0 tp=1", kill_after_s=15.0),
    LayoutRun("dp2_kill", "DP 2", 2, ("--dp", "2"), DRILL, 400,
              "SIGKILL of executor dp=1 tp=0 20 s in: 400 of 400 requests complete with every token, "
              "/health 200 throughout", kill="cadence:executor dp=1 tp=0"),
    LayoutRun("dp2tp2_kill", "DP 2 x TP 2", 4, ("--dp", "2", "--tp", "2"), DRILL, 400,
              "SIGKILL of executor dp=1 tp=1 20 s in: 400 of 400 requests complete with every token, "
              "/health 200 throughout", kill="cadence:executor dp=1 tp=1"),
    *(LayoutRun(f"{ALL_REDUCE_PREFIX}{n}", f"TP {n}", n, (), (), 0,
                "one-shot all-reduce of 10 KB (a decode token) faster than NCCL's, both in CUDA graphs "
                "(SGLang's one-shot: 3.7-4.5 us at <= 32 KB on two H100s); the crossover size sets "
                "DEFAULT_MAX_BYTES") for n in (2, 4, 8)),
    LayoutRun(MATRIX_KEY, "generalization matrix", 2, (), (), 0,
              "every cell of `--subset multi-gpu` passes on the cards there are (the layouts that need "
              "more are listed as not run)"),
)}
# The sections of the report, in order.
LAYOUTS = ("TP 2", "TP 4", "TP 8", "DP 2", "DP 4", "DP 8", "DP 2 x TP 2", "generalization matrix")
# `--runs multi-gpu`: the single-card runs the layouts are held against, on the same machine, then every
# layout run.
MULTI_GPU_GROUP = ("c1", "c302", *LAYOUT_RUNS)


def scaled_prompts(run: LayoutRun, scale: float) -> int:
    return max(1, round(run.num_prompts * scale))


def drill_command(run: LayoutRun, serve_flags: list[str], scale: float, out_dir: str) -> list[str]:
    """python -m benchmarks.fault_drill for a drill run: its server, the kill, the workload."""
    return [sys.executable, "-m", "benchmarks.fault_drill", f"--serve={shlex.join(serve_flags)}",
            "--kill", run.kill, "--kill-after", f"{run.kill_after_s:g}",
            "--out", os.path.join(out_dir, f"{run.key}.json"),
            "--server-log", os.path.join(out_dir, f"server_{run.key}.log"), "--",
            *run.load_flags, "--num-prompts", str(scaled_prompts(run, scale)), "--seed", "0"]


def is_command_run(run: LayoutRun) -> bool:
    """A run that is a program of its own (a drill, the matrix, an all-reduce sweep), not a load run."""
    return bool(run.kill) or run.key == MATRIX_KEY or run.key.startswith(ALL_REDUCE_PREFIX)


def all_reduce_command(run: LayoutRun, out_dir: str) -> list[str]:
    """python -m benchmarks.all_reduce on the run's cards."""
    return [sys.executable, "-m", "benchmarks.all_reduce", "--ranks", str(run.gpus),
            "--out", os.path.join(out_dir, f"{run.key}.json")]


def matrix_command(model: str, out_dir: str) -> list[str]:
    """The generalization matrix's multi-gpu subset on this machine's cards."""
    return [sys.executable, "-m", "benchmarks.generalization", "--subset", "multi-gpu", "--model", model,
            "--load-format", "dummy", "--device", "cuda",
            "--out", os.path.join(out_dir, f"{MATRIX_KEY}.json"),
            "--markdown", os.path.join(out_dir, f"{MATRIX_KEY}.md")]
