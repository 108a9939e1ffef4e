"""The functional generalization matrix: the real system, checked cell by cell against invariants.

    python -m benchmarks.generalization --subset cpu --out docs/reports/generalization_cpu.json \\
        --markdown docs/reports/generalization.md
    python -m benchmarks.generalization --subset full --model qwen3-14b --load-format dummy \\
        --device cuda --out generalization_h200.json --markdown generalization_h200.md
    python -m benchmarks.generalization --subset cpu --quantization fp8 \\
        --out docs/reports/generalization_cpu_fp8.json --markdown docs/reports/generalization_cpu_fp8.md
    python -m benchmarks.generalization --subset full --model qwen3-14b --load-format dummy \\
        --device cuda --quantization fp8 --out generalization_h200_fp8.json \\
        --markdown generalization_h200_fp8.md
    python -m benchmarks.generalization --subset multi-gpu --model qwen3-14b --load-format dummy \\
        --device cuda --out generalization_multi_gpu.json --markdown generalization_multi_gpu.md

Each server configuration (benchmarks/generalization/server_plans.py) is launched once (Launcher,
the native `api.client.Client`), its cells run in order, and it is shut down before the next starts:

* reference: DP1 TP1, one step at a time (async scheduling off), prefix cache off, chunked prefill
  off. Prompt lengths 1, block_size-1, block_size, block_size+1, 100 (cpu) or 1000 (full) and
  max_model_len-1, each alone with max_tokens 1, 2 and 64 (max_model_len-1 with 1); batches of 1, 7
  (and, full, 64 and 256) prompts of mixed lengths and max_tokens; text, token-id and chat prompts;
  the cache-off runs of the prefix-cache prompts; penalties; and how requests end: seeded sampling,
  stop strings, stop token ids, max_tokens, max_model_len. Its outputs are what the other servers
  must reproduce.
* prefix-cache: the cache on; cold, hot, partial-page, next-turn and full-prompt hits, each with the
  num_cached_tokens the cache's contents predict (whole pages, never the prompt's last token).
* chunked: chunked prefill with a budget of --chunk-budget (16) tokens a step.
* preemption: a pool of about a third of the pages the cell's requests need (num_preemptions must
  grow), then identical prompts at once on it.
* async: async scheduling (the serving default: two steps in flight, placeholder inputs filled by
  the executor), on the reference's settings and on a pool small enough to preempt. The other
  servers run one step at a time, as the reference does.
* dp2, tp2: two replicas, and one replica split over two ranks. A layout the model refuses (with
  --quantization fp8, a TP size that would split its 128 x 128 weight blocks) is not run, its
  cell saying why.

With `--quantization fp8` on a GPU the servers multiply with cuBLAS's block-scaled scaled_mm at
every row count (`CADENCE_FP8_GEMM=scaled_mm`, unless the environment names another GEMM), not the
serving default, which takes steps of one row through the row GEMV: the cells compare one request's
runs in steps of other sizes, scaled_mm computes every step of up to 16 rows alike, and the default
does not (a request decoding alone gets other last bits than in a batch). FP8 on the random model
turns such bits into other greedy tokens, often beyond what the near-tie rule can judge from the top
100 logprobs (which span ~1.4 nats there); with the default the matrix passed 27 of 32 cells on an
H100, every failure such a divergence (docs/reports/h100/fp8/matrix/row_gemv/). The row GEMV's own
numbers are checked in tests/gpu/test_gpu_fp8.py (the 14B shapes against the reference, a token
alone against itself in a step of several, the model's logits against exact GEMMs).

`--subset multi-gpu` is the full subset's reference and, instead of the other servers, the layouts
on cards of their own (MULTI_GPU_LAYOUTS: DP 2, 4, 8, TP 2, 4, 8, DP 2 x TP 2, and TP 2 with async
scheduling), each with the layout cell. A layout needs one visible GPU per rank; where fewer are
visible its cell is skipped with a line that says how many it needs, and the run still passes if
every cell that ran passed.

After every cell the pool must balance (benchmarks/generalization/server.py): every replica alive,
nothing running or waiting, kv_usage 0, every page free or held only by the prefix cache, within
--idle-timeout seconds, judged only on a scheduler report sent after the cell's last output.

Outputs that must agree are compared by benchmarks/generalization/compare.py: in float32 token by
token (and each sampled token's logprob within --logprob-atol); in bf16/fp16 token by token up to
a near-tie, where in both runs both diverging tokens are among the top 100 logprobs and within
--tie-tolerance nats (0.35; 1.2 for FP8: see compare.py) of that run's best; the tokens after it
are not compared.

The engine flags (`--model`, `--device`, `--dtype`, `--block-size`, `--max-model-len`, ...) make the
base configuration; each server overrides the prefix cache, chunked prefill, the token budget, the
pool size and DP/TP. Without --max-model-len the matrix uses 512 (cpu) or 2048 (full) tokens.
`--servers` runs some servers only (the reference always runs). The JSON (--out) and Markdown
(--markdown) are rewritten after every server; a table is printed at the end; exit 1 if a cell failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from api.client import ClientError
from benchmarks.generalization.cell import Cell, CellContext, Checks
from benchmarks.generalization.compare import Tolerance
from benchmarks.generalization.environment import environment
from benchmarks.generalization.layout_cells import preemption_pool
from benchmarks.generalization.report import render_markdown
from benchmarks.generalization.server import NotIdle, Server
from benchmarks.generalization.server_plans import (
    MULTI_GPU_LAYOUTS,
    SERVER_NAMES,
    ServerPlan,
    describe_config,
    server_plans,
)
from benchmarks.generalization.workload import TOP_LOGPROBS, Workload, make_shape
from core.config import EngineConfig
from procs.args import add_engine_args, config_from_args, launch_options_from_args
from procs.devices import visible_gpu_count

DEFAULT_MAX_MODEL_LEN = {"cpu": 512, "full": 2048, "multi-gpu": 2048}


# --- running ----------------------------------------------------------------------------------------


class Matrix:
    """Runs the server plans in order and collects one record per cell."""

    def __init__(self, args: argparse.Namespace, base: EngineConfig, workload: Workload,
                 tolerance: Tolerance) -> None:
        self.started_at = datetime.datetime.now(datetime.UTC)
        self._started = time.perf_counter()
        self.environment = environment()
        self.args = args
        self.base = base
        self.workload = workload
        self.tolerance = tolerance
        self.options = launch_options_from_args(args)
        self.plans = server_plans(base, workload, args.chunk_budget, args.subset)
        # Cards a layout can have to itself; a named card (cuda:N) or the CPU gives none.
        self.visible_gpus = visible_gpu_count() if base.device == "cuda" else 0
        self.refs = {}
        self.cells: list[dict] = []
        self.servers: list[dict] = []

    def run(self, wanted: set[str], after_server: Callable[[], None]) -> None:
        for plan in self.plans:
            if plan.name == "reference" or plan.name in wanted:
                self.run_server(plan)
                after_server()

    def report(self) -> dict:
        """Everything so far: the command, machine, settings, servers and one record per cell."""
        args, shape, base, cells = self.args, self.workload.shape, self.base, self.cells
        ran = [c for c in cells if not c.get("skipped")]
        return {
            "command": args.command,
            "started_at": self.started_at.isoformat(timespec="seconds"),
            "duration_s": round(time.perf_counter() - self._started, 1),
            "environment": self.environment,
            "settings": {
                "subset": args.subset, "model": base.model.name, "device": base.device,
                "dtype": base.model.dtype, "quantization": base.model.quantization,
                "weights": "dummy" if base.model.weights_are_dummy else base.model.model_path,
                "block_size": shape.block_size, "max_model_len": shape.max_model_len,
                "prompt_lengths": list(shape.prompt_lengths), "output_lengths": list(shape.output_lengths),
                "batch_sizes": list(shape.batch_sizes), "chunk_budget": args.chunk_budget,
                "preemption_num_pages": preemption_pool(self.workload), "workload_seed": args.workload_seed,
                "idle_timeout_s": args.idle_timeout, "comparison": self.tolerance.describe(),
            },
            "servers": self.servers,
            "cells": cells,
            "num_cells": len(cells),
            "num_passed": sum(c["passed"] for c in ran),
            "num_skipped": len(cells) - len(ran),
            "passed": bool(ran) and all(c["passed"] for c in ran),
        }

    def run_server(self, plan: ServerPlan) -> None:
        config = describe_config(plan.config)
        if plan.refused or plan.gpus > self.visible_gpus:
            why = plan.refused or f"not run: needs {plan.gpus} GPUs, {self.visible_gpus} visible"
            self.servers.append({"name": plan.name, "config": config, "startup_s": None, "error": why})
            self.cells += [dict(_record(cell, plan.name, config, [], {}, 0.0), passed=None, skipped=why)
                           for cell in plan.cells]
            _say(f"[{plan.name}] {why}")
            return
        server = Server(plan.name, plan.config, self.options, self.args.request_timeout)
        _say(f"[{plan.name}] starting: {_layout_words(config)}")
        try:
            server.__enter__()
        except Exception as exc:  # noqa: BLE001 - a server that cannot start fails its cells, not the run
            message = f"server {plan.name} did not start: {type(exc).__name__}: {exc}"
            self.servers.append({"name": plan.name, "config": config, "startup_s": None, "error": message})
            for cell in plan.cells:
                self.cells.append(_record(cell, plan.name, config, [message], {}, 0.0))
            _say(f"[{plan.name}] {message}")
            return
        self.servers.append({"name": plan.name, "config": config, "startup_s": round(server.startup_s, 2),
                             "error": None})
        _say(f"[{plan.name}] started in {server.startup_s:.1f} s")
        try:
            shared: dict[str, object] = {}
            for cell in plan.cells:
                self.cells.append(self.run_cell(cell, server, config, shared))
        finally:
            server.__exit__(None, None, None)

    def run_cell(self, cell: Cell, server: Server, config: dict, shared: dict) -> dict:
        checks = Checks(self.tolerance, server.score_next)
        started = time.perf_counter()
        if not server.launcher.serving:
            why = server.launcher.fatal_error or "a replica is down"
            checks.failures.append(f"server {server.name} is not serving: {why}")
        else:
            try:
                cell.run(CellContext(server, self.workload, checks, self.refs, shared))
            except Exception as exc:  # noqa: BLE001 - a cell that raises is a failed cell
                checks.failures.append(f"raised {type(exc).__name__}: {exc}")
            try:
                info = server.wait_idle(time.monotonic(), self.args.idle_timeout)
                checks.details["idle_pages"] = [
                    [r.stats.num_free_pages, r.stats.num_cached_pages, r.num_pages] for r in info.replicas]
            except (NotIdle, ClientError) as exc:
                checks.failures.append(str(exc))
        record = _record(cell, server.name, config, checks.failures, checks.summary(),
                         time.perf_counter() - started)
        _say(f"  {'pass' if record['passed'] else 'FAIL'} {cell.name} ({record['duration_s']:.1f} s)"
             + ("" if record["passed"] else f": {record['failure']}"))
        return record


def _record(cell: Cell, server: str, config: dict, failures: list[str], details: dict,
            duration_s: float) -> dict:
    return {"name": cell.name, "server": server, "config": config, "checks": cell.checks,
            "passed": not failures, "failure": "; ".join(failures) or None, "details": details,
            "duration_s": round(duration_s, 2)}


def _layout_words(config: dict) -> str:
    def on(flag: bool) -> str:
        return "on" if flag else "off"

    return (f"dp={config['dp']} tp={config['tp']}, prefix cache {on(config['prefix_caching'])}, chunked "
            f"prefill {on(config['chunked_prefill'])}, budget {config['max_num_batched_tokens']}, "
            f"pages {config['num_pages'] or 'profiled'}")


def _say(line: str) -> None:
    print(line, flush=True)


def base_config(args: argparse.Namespace) -> EngineConfig:
    config = config_from_args(args)
    max_model_len = args.max_model_len or min(DEFAULT_MAX_MODEL_LEN[args.subset], config.max_model_len)
    return replace(config, scheduler=replace(config.scheduler, max_model_len=max_model_len,
                                             max_logprobs=max(config.scheduler.max_logprobs, TOP_LOGPROBS)))


def pin_the_fp8_gemm(config: EngineConfig) -> None:
    """FP8 on a GPU: cuBLAS's scaled_mm at every row count, unless the environment names a GEMM (the
    servers inherit this process's environment; the module docstring says why)."""
    if config.model.quantization == "fp8" and config.device.startswith("cuda"):
        os.environ.setdefault("CADENCE_FP8_GEMM", "scaled_mm")


def run_matrix(args: argparse.Namespace, on_progress: Callable[[dict], None] | None = None) -> dict:
    """Run the matrix the arguments describe; returns the report (see report.py).
    `on_progress` gets the report so far after every server (a long run killed midway keeps it)."""
    base = base_config(args)
    pin_the_fp8_gemm(base)
    shape = make_shape(args.subset, base.cache.block_size, base.max_model_len)
    workload = Workload(shape, args.workload_seed)
    tolerance = Tolerance.for_dtype(base.model.dtype, args.logprob_atol, args.tie_tolerance,
                                    base.model.quantization)
    matrix = Matrix(args, base, workload, tolerance)
    matrix.run(set(args.servers.split(",")), lambda: on_progress and on_progress(matrix.report()))
    return matrix.report()


# --- the command line -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.generalization", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(parser)
    group = parser.add_argument_group("matrix")
    group.add_argument("--subset", choices=("cpu", "full", "multi-gpu"), default="cpu",
                       help="cpu: the small subset for two CPU cores; full: every shape; multi-gpu: the "
                            "full reference and the layouts on cards of their own (default: cpu)")
    group.add_argument("--servers", default=",".join(SERVER_NAMES),
                       help="comma-separated servers to run; the reference always runs (default: all of "
                            f"{','.join(SERVER_NAMES)})")
    group.add_argument("--chunk-budget", type=int, default=16,
                       help="max_num_batched_tokens of the chunked-prefill server (default: 16)")
    group.add_argument("--tie-tolerance", type=float, default=None,
                       help="bf16/fp16: nats within which a divergence is a near-tie (default: 0.35, "
                            "1.2 with FP8 activations: see benchmarks/generalization/compare.py)")
    group.add_argument("--logprob-atol", type=float, default=1e-3,
                       help="float32: how far a sampled token's logprob may move (default: 1e-3 nats)")
    group.add_argument("--idle-timeout", type=float, default=10.0,
                       help="seconds for the pool to balance after a cell (default: 10)")
    group.add_argument("--request-timeout", type=float, default=300.0,
                       help="longest silence a cell waits through for its requests (default: 300)")
    group.add_argument("--workload-seed", type=int, default=0, help="seed of the prompts (default: 0)")
    group.add_argument("--out", help="write the results as JSON here")
    group.add_argument("--markdown", help="write the Markdown report here")
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    names = ("reference", *MULTI_GPU_LAYOUTS) if args.subset == "multi-gpu" else SERVER_NAMES
    if args.subset == "multi-gpu" and args.servers == ",".join(SERVER_NAMES):
        args.servers = ",".join(names)  # the default: every server of the subset
    unknown = set(args.servers.split(",")) - set(names)
    if unknown:
        build_parser().error(f"unknown server(s) {sorted(unknown)} of --subset {args.subset}: choose from "
                             f"{', '.join(names)}")
    args.command = shlex.join(["python", "-m", "benchmarks.generalization", *argv])
    return args


def format_table(report: dict) -> str:
    rows = [(c["name"], c["server"], _result(c), f"{c['duration_s']:.1f}",
             (c["failure"] or c.get("skipped") or "")[:100]) for c in report["cells"]]
    header = ("cell", "server", "result", "s", "failure")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    skipped = f", {report['num_skipped']} skipped" if report.get("num_skipped") else ""
    lines.append(f"{report['num_passed']}/{report['num_cells']} cells passed{skipped} in "
                 f"{report['duration_s']:.0f} s")
    return "\n".join(lines)


def _result(cell: dict) -> str:
    return "skipped" if cell.get("skipped") else "pass" if cell["passed"] else "FAIL"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    os.environ.setdefault("CADENCE_LOG_LEVEL", "WARNING")  # the children's INFO lines drown the table
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s [%(name)s] %(message)s")

    def write(report: dict) -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        if args.markdown:
            Path(args.markdown).write_text(render_markdown(report))

    report = run_matrix(args, on_progress=write)
    write(report)
    print(format_table(report))
    return 0 if report["passed"] else 1

