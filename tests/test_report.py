"""The performance report is built from the committed H200 run JSON: every table, every key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks import report

REPORTS = Path(__file__).resolve().parent.parent / "docs" / "reports"


def test_the_report_of_the_committed_runs_has_every_table_and_the_figures_for_programs(tmp_path):
    report.main(["--results", str(REPORTS / "h200"), "--machine", "one H200",
                 "--kernels", str(REPORTS / "h200" / "kernels.json"),
                 "--step-profile", str(REPORTS / "h200" / "step_profile.json"),
                 "--notes", str(REPORTS / "performance_notes.md"), "--out-dir", str(tmp_path)])
    markdown = (tmp_path / "performance.md").read_text()
    for heading in ("## Load runs", "## Against transformers", "## Targets", "## Plan broadcast",
                    "## Attention kernels", "## One step, where the time goes", "## Known crash"):
        assert heading in markdown, heading
    figures = json.loads((tmp_path / "performance.json").read_text())
    for key in ("c1", "c16", "c64", "c302", "prefix_on", "prefix_off", "dp2", "peer", "peer_ratio"):
        assert key in figures, key
    assert figures["peer_ratio"] > 1
    # performance.json keeps each run's figures without its per-request arrays
    assert "requests" not in figures["c302"] and figures["c302"]["completed"] == 1000
    rows = [line for line in markdown.split("## Load runs")[1].splitlines() if line.startswith("| c302 |")]
    assert len(rows) == 1 and "1000/0" in rows[0]


def test_a_run_with_step_wait_gets_the_idle_column_and_target(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(REPORTS / "h200" / "step_wait", results)
    report.main(["--results", str(results), "--machine", "one H200", "--out-dir", str(tmp_path)])
    markdown = (tmp_path / "performance.md").read_text()
    c302 = next(line for line in markdown.splitlines() if line.startswith("| c302 |"))
    assert c302.rstrip(" |").endswith("2.7%")
    assert "| c302 GPU idle between steps | 2.7% | <= 3 % | | met |" in markdown


def test_a_report_written_beside_its_runs_is_not_read_back_as_a_run(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(REPORTS / "h200" / "step_wait", results)
    for _ in range(2):  # the second report reads the directory the first one wrote into
        report.main(["--results", str(results), "--machine", "one H200", "--out-dir", str(results)])
    figures = json.loads((results / "performance.json").read_text())
    assert "performance" not in figures and figures["c302"]["completed"] > 0
