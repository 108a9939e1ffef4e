"""What a load run reports: the summary JSON, the printed table and the plots.

`summarize` turns a LoadRun's timings and gauge samples into the result that
`python -m benchmarks.load` prints and writes (see its docstring for the keys); `print_table` and
`write_plots` render it.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from benchmarks.lib.backends import Sampling, ServerGauges
from benchmarks.lib.datasets import ideal_prefix_hit_rate
from benchmarks.lib.load_run import LoadRun


def tokens_per_second(times_s: list[float]) -> list[int]:
    """Streamed output tokens in each whole second since the run started (second 0 first)."""
    if not times_s:
        return []
    return np.bincount(np.floor(np.asarray(times_s)).astype(np.int64)).tolist()


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {k: 0.0 for k in ("mean", "median", "p90", "p99", "max")}
    a = np.asarray(values)
    return {
        "mean": float(a.mean()),
        "median": float(np.median(a)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }


def summarize(
    run: LoadRun,
    duration_s: float,
    args: argparse.Namespace,
    gauges_before: ServerGauges | None,
    run_start_s: float,
) -> dict:
    done = [(s, t) for s, t in run.timings if t.ok]
    failed = [t for _, t in run.timings if not t.ok]
    ttft = [(t.chunk_s[0] - t.sent_s) * 1e3 for _, t in done if t.chunk_s]
    tpot = [
        (t.done_s - t.chunk_s[0]) * 1e3 / (t.output_tokens - 1)
        for _, t in done
        if t.chunk_s and t.output_tokens > 1
    ]
    itl = [gap * 1e3 for _, t in done for gap in np.diff(t.chunk_s)]
    e2e = [(t.done_s - t.sent_s) * 1e3 for _, t in done]
    input_tokens = sum(t.prompt_tokens for _, t in done)
    output_tokens = sum(t.output_tokens for _, t in done)
    usage = [g.kv_cache_usage for _, g in run.gauges]
    hit_rate = None
    step_wait = None
    if run.gauges and gauges_before is not None:
        last = run.gauges[-1][1]
        queries = last.prefix_cache_queries - gauges_before.prefix_cache_queries
        hits = last.prefix_cache_hits - gauges_before.prefix_cache_hits
        hit_rate = hits / queries if queries > 0 else 0.0
        executed = last.step_execute_s - gauges_before.step_execute_s
        waited = last.step_wait_s - gauges_before.step_wait_s
        if executed + waited > 0:
            step_wait = {"execute_s": executed, "wait_s": waited, "fraction": waited / (executed + waited)}
    result = {
        "label": args.label,
        "backend": args.backend,
        "endpoint": getattr(args, "endpoint", "openai"),
        "dataset": args.dataset,
        "sampling": Sampling(args.sampling, args.temperature, args.top_p, args.top_k).describe(),
        "extra_body": getattr(args, "extra_body", None),
        "settings": {
            k: v if not (isinstance(v, float) and math.isinf(v)) else "inf" for k, v in vars(args).items()
        },
        "completed": len(done),
        "failed": len(failed),
        "errors": sorted({t.error or "no tokens" for t in failed})[:10],
        "duration_s": duration_s,
        "request_throughput": len(done) / duration_s,
        "input_throughput": input_tokens / duration_s,
        "output_throughput": output_tokens / duration_s,
        "total_token_throughput": (input_tokens + output_tokens) / duration_s,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "ttft_ms": _stats(ttft),
        "tpot_ms": _stats(tpot),
        "itl_ms": _stats(itl),
        "e2e_ms": _stats(e2e),
        "max_concurrency_reached": run.max_in_flight,
        "prefix_cache_hit_rate": hit_rate,
        "prefix_cache_hit_rate_from_usage": (
            sum(t.cached_tokens for _, t in done) / input_tokens if input_tokens else 0.0
        ),
        "kv_cache_usage": {
            "mean": float(np.mean(usage)) if usage else None,
            "peak": float(np.max(usage)) if usage else None,
            "samples": len(usage),
        },
        "requests": [
            {
                "prompt_tokens": t.prompt_tokens,
                "output_tokens": t.output_tokens,
                "cached_tokens": t.cached_tokens,
                "sent_s": t.sent_s - run_start_s,
                "sent_monotonic_s": t.sent_s,  # CLOCK_MONOTONIC on Linux: the server's step trace's clock
                "ttft_ms": (t.chunk_s[0] - t.sent_s) * 1e3 if t.chunk_s else None,
                "e2e_ms": (t.done_s - t.sent_s) * 1e3 if t.done_s else None,
                "error": t.error,
            }
            for _, t in run.timings
        ],
        # The executors' time between back-to-back steps waiting for the next plan (the GPU idle),
        # against their time running steps, from /metrics deltas over the run.
        "step_wait": step_wait,
        "kv_usage_over_time": [(ts - run_start_s, g.kv_cache_usage) for ts, g in run.gauges],
        "output_tokens_per_second": tokens_per_second([c - run_start_s for _, t in done for c in t.chunk_s]),
    }
    if args.dataset == "shared-prefix":
        result["ideal_prefix_cache_hit_rate"] = ideal_prefix_hit_rate(
            args.groups, args.prompts_per_group, args.system_len, args.question_len, args.block_size
        )
    return result


def sampling_text(sampling: dict | None) -> str:
    if sampling is None:
        return "greedy"  # results written before the load tool could sample
    sent = ", ".join(f"{k} {v:g}" for k, v in sampling["sent"].items())
    return f"{sampling['mode']}" + (f" ({sent})" if sent else "")


def print_table(result: dict) -> None:
    rows = [
        ("completed / failed", f"{result['completed']} / {result['failed']}"),
        ("sampling", sampling_text(result.get("sampling"))),
        ("duration", f"{result['duration_s']:.2f} s"),
        ("max concurrency reached", str(result["max_concurrency_reached"])),
        ("request throughput", f"{result['request_throughput']:.2f} req/s"),
        ("input / output tokens", f"{result['total_input_tokens']} / {result['total_output_tokens']}"),
        ("input throughput", f"{result['input_throughput']:.1f} tok/s"),
        ("output throughput", f"{result['output_throughput']:.1f} tok/s"),
        ("total token throughput", f"{result['total_token_throughput']:.1f} tok/s"),
    ]
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        s = result[name]
        rows.append(
            (
                name.replace("_ms", "").upper() + " mean/median/p99 (ms)",
                f"{s['mean']:.1f} / {s['median']:.1f} / {s['p99']:.1f}",
            )
        )
    hit = result["prefix_cache_hit_rate"]
    rows.append(("prefix cache hit rate", "n/a" if hit is None else f"{hit:.1%}"))
    if "ideal_prefix_cache_hit_rate" in result:
        rows.append(("ideal hit rate", f"{result['ideal_prefix_cache_hit_rate']:.1%}"))
    kv = result["kv_cache_usage"]
    if kv["mean"] is not None:
        rows.append(("KV cache usage mean / peak", f"{kv['mean']:.1%} / {kv['peak']:.1%}"))
    wait = result.get("step_wait")
    if wait is not None:
        rows.append(("GPU idle between steps", f"{wait['fraction']:.1%} ({wait['wait_s']:.2f} s waiting, "
                                                f"{wait['execute_s']:.2f} s running steps)"))
    structured = result.get("structured")
    if structured is not None:
        correct = f"{structured['correct']} / {structured['checked']}"
        rows.append((f"{structured['kind']} outputs correct", correct))
    width = max(len(r[0]) for r in rows)
    print("=" * (width + 24))
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print("=" * (width + 24))
    if result["errors"]:
        print("errors:", *result["errors"], sep="\n  ")


def write_plots(result: dict, directory: str) -> list[str]:
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    paths = []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (name, key) in zip(axes, (("TTFT", "ttft_ms"), ("E2E latency", "e2e_ms"), ("TPOT", None))):
        if key is not None:
            values = sorted(r[key] for r in result["requests"] if r[key] is not None)
        else:
            values = sorted(
                (r["e2e_ms"] - r["ttft_ms"]) / (r["output_tokens"] - 1)
                for r in result["requests"]
                if r["e2e_ms"] and r["ttft_ms"] and r["output_tokens"] > 1
            )
        if values:
            ax.plot(values, np.arange(1, len(values) + 1) / len(values))
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    fig.suptitle(f"latency CDFs {result['label']}")
    paths.append(os.path.join(directory, "latency_cdf.png"))
    fig.savefig(paths[-1], dpi=100, bbox_inches="tight")
    plt.close(fig)

    fig, ax1 = plt.subplots(figsize=(10, 4))
    counts = result["output_tokens_per_second"]
    if counts:
        ax1.plot(np.arange(len(counts)), counts, label="output tokens/s")
    ax1.set_xlabel("time (s)")
    ax1.set_ylabel("output tokens per second")
    ax2 = ax1.twinx()
    if result["kv_usage_over_time"]:
        t, u = zip(*result["kv_usage_over_time"])
        ax2.plot(t, np.asarray(u) * 100, color="tab:red", label="KV usage %")
    ax2.set_ylabel("KV cache usage (%)")
    fig.legend(loc="upper right")
    paths.append(os.path.join(directory, "throughput_kv.png"))
    fig.savefig(paths[-1], dpi=100, bbox_inches="tight")
    plt.close(fig)
    return paths
