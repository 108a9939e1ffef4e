"""Build docs/reports/performance.md and performance.json from a results directory.

    python -m benchmarks.report --results results/ --machine "one NVIDIA H200" \\
        --notes docs/reports/performance_notes.md

Reads the JSON that `python -m benchmarks.suite` left (c1.json, c16.json, ..., peer.json), and
optionally broadcast.json (`python -m benchmarks.broadcast`) and the JSON of
`python -m benchmarks.kernels` (given with --kernels) and of `python -m benchmarks.step_profile`
(--step-profile). Every table row names the command that made it. performance.json
holds the same figures for programs (each run's load-tool JSON without its per-request arrays),
plus `peer_ratio` = Cadence's total token throughput over the peer's on the same workload, and
`layouts`: the multi-card runs by layout, "not run: needs N GPUs" where their JSON is absent
(benchmarks/lib/layout_report.py). The multi-card runs may come from another machine than the
rest:

    python -m benchmarks.report --results docs/reports/h200 --machine "one NVIDIA H200" \
        --layout-results results_8gpu/ --layout-machine "eight NVIDIA H100" ...
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess

from benchmarks.lib.layout_report import layout_markdown, layout_rows
from benchmarks.lib.load_summary import sampling_text

ORDER = ("chat", "c1", "c1_defaults", "c4", "c16", "c64", "c302", "c302_defaults", "c1_sync", "c302_sync",
         "prefix_on", "prefix_on_sync", "prefix_off", "dp2", "prefix_burst_dp1", "prefix_burst_dp2",
         "prefix_burst_dp1_fp8", "prefix_burst_dp2_fp8",
         "peer_cadence", "tp2", "tp2_c302", "tp4", "tp8", "dp2_gpus", "dp4_gpus", "dp8_gpus", "dp2tp2",
         "c1_fp8", "c1_fp8_defaults", "c4_fp8", "c302_fp8", "c302_fp8_defaults", "prefix_on_fp8",
         "peer_cadence_fp8")
# Per-request and per-sample arrays of the load tool, a drill's /health samples, the matrix's cells.
_BULKY = ("requests", "output_tokens_per_second", "kv_usage_over_time", "health", "cells")

# Issue targets (Qwen3-14B, bf16, one H200) and vLLM's figures on the same workloads.
TARGETS = [
    ("c1 median TPOT (ms)", "c1", ("tpot_ms", "median"), "<=", 7.2, "vLLM 9.0"),
    ("c1 median TTFT (ms)", "c1", ("ttft_ms", "median"), "<=", 75.0, "vLLM 85"),
    ("c302 total tok/s", "c302", ("total_token_throughput",), ">=", 20000.0, "vLLM 17,934"),
    ("c302 output tok/s", "c302", ("output_throughput",), ">=", 2500.0, "vLLM 2,251"),
    # Qwen3-14B FP8 (issue 22): the weight-read floor of a decode step is about 3.5 ms.
    ("FP8 c1 median TPOT (ms)", "c1_fp8", ("tpot_ms", "median"), "<=", 4.5, "bf16 8.4"),
    ("FP8 c1 median TTFT, 1,784 tokens (ms)", "c1_fp8", ("ttft_ms", "median"), "<=", 50.0, ""),
    ("FP8 c302 total tok/s", "c302_fp8", ("total_token_throughput",), ">=", 27000.0,
     "1.5 x vLLM bf16 17,934"),
]


def _get(result: dict, path: tuple[str, ...]):
    for key in path:
        result = result[key]
    return result


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def load_results(directory: str) -> dict[str, dict]:
    """Every run's JSON in `directory`; not a report this tool wrote there (performance.json), which
    would otherwise nest the previous report inside the next."""
    results = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json") and name != "performance.json":
            with open(os.path.join(directory, name)) as f:
                results[name[: -len(".json")]] = json.load(f)
    return results


def build(results: dict[str, dict], machine: str, layout_results: dict[str, dict] | None = None,
          layout_machine: str | None = None) -> dict:
    """The figures of `results`; the layout rows from `layout_results` (made on `layout_machine`)
    when given, else from `results` too."""
    figures = {"machine": machine, "platform": platform.platform(), "cadence_commit": _git_commit()}
    for key, result in results.items():
        figures[key] = {k: v for k, v in result.items() if k not in _BULKY}
    peer, mine = results.get("peer"), results.get("peer_cadence")
    if peer and mine and peer.get("total_token_throughput"):
        figures["peer_ratio"] = mine["total_token_throughput"] / peer["total_token_throughput"]
    mine_fp8 = results.get("peer_cadence_fp8")
    if peer and mine_fp8 and peer.get("total_token_throughput"):
        figures["peer_ratio_fp8"] = mine_fp8["total_token_throughput"] / peer["total_token_throughput"]
    on, off = results.get("prefix_on"), results.get("prefix_off")
    if on and off and off["ttft_ms"]["median"]:
        figures["prefix_ttft_speedup"] = off["ttft_ms"]["median"] / max(on["ttft_ms"]["median"], 1e-9)
        ideal = on.get("ideal_prefix_cache_hit_rate")
        if ideal and on.get("prefix_cache_hit_rate") is not None:
            figures["prefix_hit_rate_of_ideal"] = on["prefix_cache_hit_rate"] / ideal
    figures["layouts"] = layout_rows(results if layout_results is None else layout_results)
    if layout_machine:
        figures["layout_machine"] = layout_machine
    return figures


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def markdown(figures: dict, notes: str) -> str:
    lines = [
        "# Performance report",
        "",
        f"Machine: {figures['machine']}. Generated by `python -m benchmarks.report` (on "
        f"{figures['platform']}) at Cadence commit {figures['cadence_commit']} from the "
        "JSON of `python -m benchmarks.suite`; every row names the commands that made it.",
        "",
    ]
    runs = [k for k in ORDER if k in figures]
    if runs:
        lines += [
            "## Load runs",
            "",
            "| run | sampling | done/failed | req/s | output tok/s | total tok/s | TTFT median / p99 ms | "
            "TPOT median / p99 ms | ITL p99 ms | E2E median / p99 ms | max conc. | prefix hit | "
            "KV mean / peak | GPU idle between steps |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for key in runs:
            r = figures[key]
            hit = r.get("prefix_cache_hit_rate")
            kv = r.get("kv_cache_usage") or {}
            kv_text = "n/a" if kv.get("mean") is None else f"{kv['mean']:.1%} / {kv['peak']:.1%}"
            wait = r.get("step_wait")
            wait_text = "n/a" if wait is None else f"{wait['fraction']:.1%}"
            lines.append(
                f"| {key} | {sampling_text(r.get('sampling'))} | {r['completed']}/{r['failed']} | "
                f"{_fmt(r['request_throughput'], 2)} | "
                f"{_fmt(r['output_throughput'])} | {_fmt(r['total_token_throughput'])} | "
                f"{_fmt(r['ttft_ms']['median'])} / {_fmt(r['ttft_ms']['p99'])} | "
                f"{_fmt(r['tpot_ms']['median'], 2)} / {_fmt(r['tpot_ms']['p99'], 2)} | "
                f"{_fmt(r['itl_ms']['p99'], 2)} | "
                f"{_fmt(r['e2e_ms']['median'])} / {_fmt(r['e2e_ms']['p99'])} | "
                f"{r['max_concurrency_reached']} | {'n/a' if hit is None else f'{hit:.1%}'} | {kv_text} | "
                f"{wait_text} |"
            )
        lines += ["", "Commands:", ""]
        for key in runs:
            r = figures[key]
            scale = r.get("scale", 1.0)
            lines.append(
                f"* {key}: `{r.get('server_command', '?')}` then `{r.get('load_command', '?')}`"
                + (f" (scaled x{scale})" if scale != 1.0 else "")
            )
        lines.append("")
    if "peer" in figures:
        peer = figures["peer"]
        lines += [
            "## Against transformers (same GPU, same dummy weights, same prompts)",
            "",
            "| engine | prompts | in / out | total tok/s | output tok/s |",
            "| --- | --- | --- | --- | --- |",
            f"| transformers {peer.get('transformers_version', '')} generate_batch | {peer['num_prompts']} | "
            f"{peer['input_len']} / {peer['output_len']} | {_fmt(peer['total_token_throughput'])} | "
            f"{_fmt(peer['output_throughput'])} |",
        ]
        if "peer_cadence" in figures:
            mine = figures["peer_cadence"]
            lines.append(
                f"| Cadence | {mine['completed']} | 512 / 128 | {_fmt(mine['total_token_throughput'])} | "
                f"{_fmt(mine['output_throughput'])} |"
            )
        if "peer_cadence_fp8" in figures:
            mine = figures["peer_cadence_fp8"]
            lines.append(
                f"| Cadence FP8 | {mine['completed']} | 512 / 128 | {_fmt(mine['total_token_throughput'])} | "
                f"{_fmt(mine['output_throughput'])} |"
            )
        if "peer_ratio" in figures:
            lines += [
                "",
                f"peer_ratio (Cadence total tok/s / transformers'): **{figures['peer_ratio']:.2f}x**",
            ]
        if "peer_ratio_fp8" in figures:
            ratio = figures["peer_ratio_fp8"]
            lines += ["", f"peer_ratio_fp8 (Cadence FP8 / transformers bf16): **{ratio:.2f}x**"]
        lines.append("")
    target_rows = []
    for name, key, path, op, goal, reference in TARGETS:
        if key in figures:
            value = _get(figures[key], path)
            met = value <= goal if op == "<=" else value >= goal
            target_rows.append(
                f"| {name} | {_fmt(value)} | {op} {goal:,.1f} | {reference} | {'met' if met else 'missed'} |"
            )
    if "prefix_ttft_speedup" in figures:
        value = figures["prefix_ttft_speedup"]
        target_rows.append(
            f"| shared-prefix TTFT without cache / with | {value:.2f}x | >= 3x | | "
            f"{'met' if value >= 3 else 'missed'} |"
        )
    if "prefix_hit_rate_of_ideal" in figures:
        value = figures["prefix_hit_rate_of_ideal"]
        target_rows.append(
            f"| shared-prefix hit rate / ideal | {value:.1%} | >= 90 % | | "
            f"{'met' if value >= 0.9 else 'missed'} |"
        )
    wait = figures.get("c302", {}).get("step_wait")
    if wait is not None:
        target_rows.append(
            f"| c302 GPU idle between steps | {wait['fraction']:.1%} | <= 3 % | | "
            f"{'met' if wait['fraction'] <= 0.03 else 'missed'} |"
        )
    if "peer_ratio" in figures:
        value = figures["peer_ratio"]
        target_rows.append(
            f"| total tok/s vs transformers | {value:.2f}x | >= 10x | | "
            f"{'met' if value >= 10 else 'missed'} |"
        )
    if target_rows:
        lines += [
            "## Targets",
            "",
            "| figure | Cadence | target | reference | |",
            "| --- | --- | --- | --- | --- |",
            *target_rows,
            "",
        ]
    if "layouts" in figures:
        lines += layout_markdown(figures["layouts"], figures.get("layout_machine"))
    if "broadcast" in figures:
        b = figures["broadcast"]
        lines += [
            "## Plan broadcast",
            "",
            f"`python -m benchmarks.broadcast --readers {b['readers']} --batch {b['batch']}`: from the "
            f"scheduler starting to write a {b['plan_bytes'] // 1024} KiB slot to every reader holding it, "
            f"median {b['median_us']:.1f} us, p99 {b['p99_us']:.1f} us "
            f"(readers spin {b.get('spin_us', 0):g} us "
            "before blocking on the doorbell).",
            "",
        ]
    if figures.get("kernels", {}).get("fp8_gemms"):
        lines += _fp8_gemm_lines(figures["kernels"])
    if figures.get("kernels", {}).get("rows"):
        k = figures["kernels"]
        lines += ["## Attention kernels", "",
                  f"`python -m benchmarks.kernels` on {k['device']}, {k['dtype']}, "
                  "Qwen3-14B per-layer shapes "
                  f"({k['shapes']['q_heads']} query heads, {k['shapes']['kv_heads']} KV heads, head_dim "
                  f"{k['shapes']['head_dim']}, block_size {k['shapes']['block_size']}); achieved bandwidth "
                  f"against the {k['ceiling_tb_s']} TB/s ceiling, replayed from a CUDA graph.", "",
                  "| kernel | case | MB moved | us | TB/s | % of ceiling | TFLOP/s | max error vs float32 |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for row in k["rows"]:
            lines.append(f"| {row['kernel']} | {row['case']} | {row['mbytes']:.1f} | {row['graph_us']:.1f} | "
                         f"{row['graph_tb_s']:.2f} | {row['graph_tb_s'] / k['ceiling_tb_s']:.0%} | "
                         f"{_fmt(row['tflops'])} | {_fmt(row['error'], 4) if row['error'] else 'n/a'} |")
        lines.append("")
    if "step_profile" in figures:
        lines += _step_profile_lines(figures["step_profile"])
    if notes:
        lines += [notes.strip(), ""]
    return "\n".join(lines)


def _fp8_gemm_lines(k: dict) -> list[str]:
    """Qwen3-14B's linear layers in bf16 and FP8 (python -m benchmarks.kernels --fp8)."""
    lines = ["## Linear layers, bf16 and FP8", "",
             f"`python -m benchmarks.kernels --fp8` on {k['device']}: median us (CUDA graph replay where it "
             f"ran), against {k['ceiling_tb_s']} TB/s and 989 (bf16) / 1,979 (FP8) TFLOP/s.", "",
             "| layer | M | path | us | TB/s | TFLOP/s | max error vs float32 | note |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in k["fp8_gemms"]:
        micros = row["graph_us"] or row["do_bench_us"]
        lines.append(f"| {row['layer']} | {row['m']} | {row['path']} | {_fmt(micros)} | "
                     f"{_fmt(row['tb_s'], 2)} | {_fmt(row['tflops'])} | {_fmt(row['error'], 4)} | "
                     f"{row['note']} |")
    return [*lines, ""]


def _step_profile_lines(sp: dict) -> list[str]:
    """Where one step's milliseconds go (python -m benchmarks.step_profile)."""
    cats = ("linear", "attention", "norm_rope_act", "elementwise_other", "sampler")
    lines = ["## One step, where the time goes", "",
             f"`python -m benchmarks.step_profile --model {sp['model']} --context {sp['context']}` on "
             f"{sp['device']}: the ModelRunner alone (no scheduler, no IPC), decode requests at "
             f"{sp['context']} tokens of context. Weights {sp['weight_gb']:.2f} GB: reading each byte once "
             f"at 4.3 TB/s takes {sp['weight_floor_ms']:.2f} ms. `graph` is the CUDA graph (forward and "
             "logits), `execute` adds the sampler and the tokens' trip to the host, `eager` launches the "
             "same forward kernel by kernel; the kernel columns are GPU time by category of one step "
             f"(measured in: {', '.join(sorted({r.get('kernels_from', '?') for r in sp['decode']}))}), "
             "`gap` the graph's time with no kernel running.", "",
             "| batch | graph ms | execute ms | eager ms | kernels | " + " | ".join(cats) + " | gap ms |",
             "| --- " * (6 + len(cats)) + "|"]
    for row in sp["decode"]:
        k = row.get("kernels_ms", {})
        lines.append(f"| {row['batch']} | {_fmt(row.get('graph_ms'), 2)} | {_fmt(row['execute_ms'], 2)} | "
                     f"{_fmt(row['eager_ms'], 2)} | {row.get('num_kernels', 0)} | "
                     + " | ".join(_fmt(k.get(c, 0.0), 2) for c in cats)
                     + f" | {_fmt(row.get('gap_ms'), 2)} |")
    pre = sp["prefill"]
    k = pre["kernels_ms"]
    lines += ["", f"Prefill of {pre['tokens']} tokens (one request): {pre['execute_ms']:.1f} ms, "
              f"{pre['tflop_s']:.0f} TFLOP/s counting the weight products only; GPU time "
              + ", ".join(f"{c} {k.get(c, 0.0):.1f} ms" for c in cats) + "."]
    mem = sp.get("memory")
    if mem:
        allocators = [(name, gib) for name, gib in mem["top_allocating_ops_gib"] if gib >= 0.01][:5]
        text = (f"Memory: {mem['allocated_before_kv_gib']:.2f} GiB resident (weights, the KV pool of this "
                f"run, graphs); the warm-up step that sizes the KV pool peaks "
                f"{mem['step_peak_above_weights_gib']:.2f} GiB above that")
        if allocators:
            text += "; its largest allocators: " + ", ".join(f"{n[:60]} {g:.2f} GiB" for n, g in allocators)
        lines += ["", text + "."]
    return [*lines, ""]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--results", required=True, help="the directory of run JSON files")
    p.add_argument("--machine", required=True, help="what the runs ran on, in words")
    p.add_argument("--kernels", help="the JSON of python -m benchmarks.kernels, for its table")
    p.add_argument("--step-profile", help="the JSON of python -m benchmarks.step_profile, for its table")
    p.add_argument("--layout-results", help="the directory of the multi-card runs' JSON, when they ran "
                                            "elsewhere (default: --results)")
    p.add_argument("--layout-machine", help="what the multi-card runs ran on (default: --machine)")
    p.add_argument("--notes", help="a Markdown file appended to the report (findings, known issues)")
    p.add_argument("--out-dir", default="docs/reports", help="where performance.md/.json go")
    args = p.parse_args(argv)
    layout_results = load_results(args.layout_results) if args.layout_results else None
    figures = build(load_results(args.results), args.machine, layout_results, args.layout_machine)
    if args.kernels:
        with open(args.kernels) as f:
            figures["kernels"] = json.load(f)
    if args.step_profile:
        with open(args.step_profile) as f:
            figures["step_profile"] = json.load(f)
    notes = ""
    if args.notes:
        with open(args.notes) as f:
            notes = f.read()
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "performance.json"), "w") as f:
        json.dump(figures, f, indent=1)
    with open(os.path.join(args.out_dir, "performance.md"), "w") as f:
        f.write(markdown(figures, notes))
    print(f"wrote {args.out_dir}/performance.md and performance.json")


if __name__ == "__main__":
    main()
