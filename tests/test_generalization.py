"""The functional generalization matrix's CPU subset, run in this process against the real system.

Every cell must pass (each is a set of invariants: outputs equal across layouts, exact counts and
finish reasons, num_cached_tokens as the radix cache should give it, a balanced pool after every
cell), and the Markdown report must have one row per cell.
"""

from __future__ import annotations

import pytest

from benchmarks.generalization import format_table, parse_args, run_matrix
from benchmarks.generalization_report import render_markdown


@pytest.fixture(scope="module")
def report() -> dict:
    return run_matrix(parse_args(["--subset", "cpu", "--device", "cpu"]))


def test_every_cell_of_the_cpu_subset_passes(report):
    failed = [f"{c['name']} ({c['server']}): {c['failure']}" for c in report["cells"] if not c["passed"]]
    assert not failed, "\n".join(failed) + "\n" + format_table(report)
    assert report["passed"]


def test_the_cpu_subset_covers_every_server_and_the_cache_cells(report):
    assert [s["name"] for s in report["servers"]] == ["reference", "prefix-cache", "chunked", "preemption",
                                                      "dp2", "tp2"]
    names = {c["name"] for c in report["cells"]}
    for wanted in ("prefix cache off", "prefix cache cold", "prefix cache hot",
                   "prefix cache partial-page hit", "prefix cache next turn", "prefix cache full-prompt hit",
                   "preemption (small pool)", "8 identical prompts at once (small pool)", "DP 2", "TP 2",
                   "batch 7", "seeded sampling", "stop string", "stop token id", "max_tokens",
                   "max_model_len"):
        assert wanted in names
    preemption = next(c for c in report["cells"] if c["server"] == "preemption")
    assert preemption["details"]["num_preemptions"] > 0


def test_the_markdown_report_has_one_row_per_cell(report):
    markdown = render_markdown(report)
    section = markdown.split("## Cells", 1)[1].strip().splitlines()
    rows = [line for line in section[2:] if line.startswith("| ")]  # after the header and its rule
    assert len(rows) == report["num_cells"] == len(report["cells"])
    for number, (row, cell) in enumerate(zip(rows, report["cells"]), start=1):
        assert row.startswith(f"| {number} | {cell['name']} | {cell['server']} | ")
    assert report["command"] in markdown
    assert report["environment"]["torch"] in markdown
