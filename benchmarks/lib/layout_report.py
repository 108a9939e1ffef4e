"""The performance report's sections for layouts on several cards (benchmarks/lib/layout_runs.py).

Every run of the multi-card validation has a row in its layout's section, run or not: a run whose
JSON is not among the results reads "not run: needs N GPUs", so the report says what has not been
measured rather than leaving it out. A row that ran shows its figures and whether it met its goal.
performance.json holds the same rows under "layouts".
"""

from __future__ import annotations

from benchmarks.lib.layout_runs import ALL_REDUCE_PREFIX, LAYOUT_RUNS, LAYOUTS, MATRIX_KEY, LayoutRun

# c1 median TPOT goals (ms) of the issue that asked for TP; TP 1 on one H200 is 8.4 ms.
TPOT_GOAL_MS = {"tp2": 4.3, "tp4": 3.0}
# DP runs against N x the single-replica run on the same request shape, at 95 %.
THROUGHPUT_BASELINE = {"dp2_gpus": ("c302", 2), "dp4_gpus": ("c302", 4), "dp8_gpus": ("c302", 8),
                       "dp2tp2": ("tp2_c302", 2)}
DP_EFFICIENCY_GOAL = 0.95
# A drill on a TP 2 replica with no other replica: the streams in flight end this fast at most.
TP_KILL_END_GOAL_S = 5.0


def layout_rows(results: dict[str, dict]) -> dict[str, list[dict]]:
    """For performance.json: per layout section, one row per run, from the suite's results."""
    sections: dict[str, list[dict]] = {name: [] for name in LAYOUTS}
    for key, run in LAYOUT_RUNS.items():
        result = results.get(key)
        row = {"run": key, "gpus": run.gpus, "goal": run.goal}
        if result is None:
            row.update(result=f"not run: needs {run.gpus} GPUs", met=None, command=None)
        else:
            text, met = _outcome(run, result, results)
            row.update(result=text, met=met, command=_command(result))
        sections[run.layout].append(row)
    return sections


def layout_markdown(sections: dict[str, list[dict]], machine: str | None = None) -> list[str]:
    """The report's "Layouts on several cards" part: one subsection per layout."""
    ran = sum(not row["result"].startswith("not run") for rows in sections.values() for row in rows)
    total = sum(len(rows) for rows in sections.values())
    lines = ["## Layouts on several cards", "",
             f"{ran} of {total} runs made" + (f", on {machine}" if ran and machine else "")
             + ". Each is a `cadence serve` with one card per rank, Qwen3-14B with dummy weights, from "
             "`python -m benchmarks.suite --runs multi-gpu` (benchmarks/lib/layout_runs.py lists every "
             "run's workload); a row stays \"not run: needs N GPUs\" until a machine with that many cards "
             "runs it.", ""]
    for name, rows in sections.items():
        gpus = sorted({row["gpus"] for row in rows})
        lines += [f"### {name} ({', '.join(map(str, gpus))} GPUs)", "",
                  "| run | GPUs | goal | result | |", "| --- | --- | --- | --- | --- |"]
        for row in rows:
            mark = "" if row["met"] is None else "met" if row["met"] else "missed"
            lines.append(f"| {row['run']} | {row['gpus']} | {row['goal']} | {row['result']} | {mark} |")
        commands = [f"* {row['run']}: `{row['command']}`" for row in rows if row["command"]]
        lines += ["", *commands, ""] if commands else [""]
    return lines


def _command(result: dict) -> str | None:
    if "suite_command" in result:
        return result["suite_command"]
    if "server_command" in result:
        return f"{result['server_command']} ; {result.get('load_command', '?')}"
    return result.get("command")


def _outcome(run: LayoutRun, result: dict, results: dict[str, dict]) -> tuple[str, bool | None]:
    """What a run measured, in words, and whether that met its goal (None: no goal to hold it to)."""
    if run.key == MATRIX_KEY:
        skipped = result.get("num_skipped", 0)
        text = (f"{result['num_passed']} of {result['num_cells']} cells passed"
                + (f", {skipped} not run (too few GPUs)" if skipped else ""))
        return text, bool(result.get("passed"))
    if run.kill:
        return _drill_outcome(run, result)
    if run.key.startswith(ALL_REDUCE_PREFIX):
        return _all_reduce_outcome(result)
    tpot, total = result["tpot_ms"]["median"], result["total_token_throughput"]
    text = (f"{result['completed']}/{result['failed']} done/failed; TPOT median {tpot:.2f} ms; "
            f"total {total:,.0f} tok/s")
    if run.key in TPOT_GOAL_MS:
        return text, result["failed"] == 0 and tpot <= TPOT_GOAL_MS[run.key]
    if run.key in THROUGHPUT_BASELINE:
        base_key, replicas = THROUGHPUT_BASELINE[run.key]
        base = results.get(base_key)
        if base is None:
            return text + f"; {base_key} not among the results, no ratio", None
        ratio = total / (replicas * base["total_token_throughput"])
        return (text + f"; {ratio:.1%} of {replicas} x {base_key}",
                result["failed"] == 0 and ratio >= DP_EFFICIENCY_GOAL)
    return text, None


def _all_reduce_outcome(result: dict) -> tuple[str, bool]:
    token = next(r for r in result["rows"] if r["bytes"] == 10240)
    custom, nccl = token["custom_us"], token["nccl_us"]
    if custom is None:
        return "the one-shot kernel turned itself off (see the run's log)", False
    crossover = result.get("crossover_bytes")
    text = (f"10 KB: one-shot {custom:.1f} us, NCCL {nccl:.1f} us; "
            + (f"NCCL as fast from {crossover:,} bytes up" if crossover else "one-shot faster at every size"))
    correct = all(r["custom_ok"] is not False for r in result["rows"])
    return text + ("" if correct else "; WRONG SUMS"), correct and custom < nccl


def _drill_outcome(run: LayoutRun, result: dict) -> tuple[str, bool]:
    # Drills before `in_flight_ended` was reported counted the moved requests that completed.
    num_ended = result.get("in_flight_ended", result.get("moved_completed", 0))
    ended = result.get("in_flight_end_after_kill_s") or result.get("moved_end_after_kill_s") or {}
    text = (f"{result['completed']} of {result['requests']} completed, {result['failed']} failed, "
            f"{result['short']} short; {result['in_flight_at_kill']} in flight at the kill, "
            f"{num_ended} ended, the last {ended.get('max', float('nan')):.2f} s after it")
    everyone_ended = num_ended == result["in_flight_at_kill"]
    if "--dp" in run.server_flags:  # a replica is left: every request completes, with all its tokens
        return text, everyone_ended and result["failed"] == 0 and result["short"] == 0
    return text, everyone_ended and ended.get("max", float("inf")) <= TP_KILL_END_GOAL_S
