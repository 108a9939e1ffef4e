"""The Markdown report of a generalization matrix run (the JSON of
benchmarks/generalization/matrix.py).

    python -m benchmarks.generalization.report docs/reports/generalization_cpu.json \\
        --out docs/reports/generalization.md

It says what made the results (the command), where (platform, CPUs, GPUs), with what (python,
torch, the Cadence commit), the settings, the servers, and one table row per cell: pass or fail,
what it checked, its time, and what it measured or why it failed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def render_markdown(report: dict) -> str:
    env, settings = report["environment"], report["settings"]
    skipped = report.get("num_skipped", 0)
    failed = report["num_cells"] - report["num_passed"] - skipped
    lines = [
        "# Functional generalization matrix",
        "",
        f"{report['num_passed']} of {report['num_cells']} cells passed"
        + (f", **{failed} failed**" if failed else "")
        + (f", {skipped} not run (too few GPUs visible, or a layout the model refuses)" if skipped else "")
        + f", in {report['duration_s']:.0f} s "
        f"(started {report['started_at']}). Made by:",
        "",
        "```",
        report["command"],
        "```",
        "",
        "Each cell runs requests through the real system (launcher, tokenizer, scheduler and executor "
        "processes, the native ZeroMQ client) and checks invariants; after every cell the pool must "
        "balance: every replica alive, nothing running or waiting, no page owned, every page free or "
        "held only by the prefix cache. `--subset full` adds prompts of 1000 tokens, batches of 64 "
        "and 256 and a max_model_len of 2048; `--subset multi-gpu` runs the full reference and the "
        "layouts on cards of their own. benchmarks/generalization/matrix.py's docstring lists every "
        "server and cell.",
        "",
        "## Machine and versions",
        "",
        "| | |",
        "| --- | --- |",
        f"| platform | {env['platform']} ({env['machine']}) |",
        f"| CPU | {env['processor']}, {env['cpu_count']} cores ({env['cpus_usable']} usable) |",
        f"| GPU | {', '.join(env['gpus']) or 'none'} |",
        f"| python | {env['python']} |",
        f"| torch | {env['torch']} |",
        f"| cadence commit | {env['cadence_commit'] or 'unknown'} |",
        f"| CADENCE_FP8_GEMM | {env.get('fp8_gemm') or 'auto'} |",
        "",
        "## Settings",
        "",
        "| | |",
        "| --- | --- |",
        f"| subset | {settings['subset']} |",
        f"| model | {settings['model']} ({settings['weights']} weights), {settings['dtype']} on "
        f"{settings['device']} |",
        f"| block_size, max_model_len | {settings['block_size']}, {settings['max_model_len']} |",
        f"| prompt lengths (alone) | {_join(settings['prompt_lengths'])} |",
        f"| max_tokens | {_join(settings['output_lengths'])} |",
        f"| batch sizes | {_join(settings['batch_sizes'])} |",
        f"| chunked-prefill budget | {settings['chunk_budget']} tokens a step |",
        f"| preemption pool | {settings['preemption_num_pages']} pages |",
        f"| outputs agree when | {settings['comparison']} |",
        f"| pool balance wait | {settings['idle_timeout_s']:g} s |",
        "",
        "## Servers",
        "",
        "| server | dp | tp | prefix cache | chunked prefill | async scheduling | token budget | KV pages "
        "| start (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for server in report["servers"]:
        c = server["config"]
        start = server["error"] if server["error"] else f"{server['startup_s']:.1f}"
        lines.append(f"| {server['name']} | {c['dp']} | {c['tp']} | {_on(c['prefix_caching'])} | "
                     f"{_on(c['chunked_prefill'])} | {_on(c.get('async_scheduling', False))} | "
                     f"{c['max_num_batched_tokens']} | "
                     f"{c['num_pages'] or 'profiled'} | {_cell_text(start)} |")
    lines += [
        "",
        "## Cells",
        "",
        "| # | cell | server | result | checked | time (s) | measured, or why it failed |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for number, cell in enumerate(report["cells"], start=1):
        result = "skipped" if cell.get("skipped") else "pass" if cell["passed"] else "**FAIL**"
        outcome = cell.get("skipped") or cell["failure"] or _details(cell["details"])
        lines.append(f"| {number} | {_cell_text(cell['name'])} | {cell['server']} | {result} | "
                     f"{_cell_text(cell['checks'])} | {cell['duration_s']:.1f} | {_cell_text(outcome)} |")
    lines.append("")
    return "\n".join(lines)


def _join(values: list) -> str:
    return ", ".join(str(v) for v in values)


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _details(details: dict) -> str:
    shown = {k: v for k, v in details.items() if k != "idle_pages"}
    return "; ".join(f"{k}: {json.dumps(v, separators=(', ', ': '))}" for k, v in shown.items())


def _cell_text(text: str) -> str:
    """Fit a table cell: one line, pipes escaped, long texts cut."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= 600 else text[:597] + "..."


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.generalization.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="the JSON of python -m benchmarks.generalization --out")
    parser.add_argument("--out", help="write the Markdown here (default: print it)")
    args = parser.parse_args(argv)
    markdown = render_markdown(json.loads(Path(args.results).read_text()))
    if args.out:
        Path(args.out).write_text(markdown)
    else:
        print(markdown, end="")


if __name__ == "__main__":
    main()
