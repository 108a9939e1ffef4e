"""The multi-card validation on a machine without the cards: the suite names every run it cannot make
and the command it would run, starts nothing and does not fail; the performance report keeps one
section per layout whose rows read "not run: needs N GPUs" until their JSON is there, and holds the
runs that are there to their goals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import report, suite
from benchmarks.lib.layout_runs import LAYOUT_RUNS, LAYOUTS
from procs import devices

REPORTS = Path(__file__).resolve().parent.parent / "docs" / "reports"


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(devices, "visible_gpu_count", lambda: 2)  # what the launcher would count


def test_the_multi_gpu_group_is_the_single_card_baselines_then_every_layout_run(two_gpus, tmp_path, capsys):
    suite.main(["--runs", "multi-gpu", "--out-dir", str(tmp_path / "results"), "--dry-run"])
    keys = [line.split(":")[0].removeprefix("[suite] ") for line in capsys.readouterr().out.splitlines()
            if "not run" not in line]
    assert keys == ["c1", "c302", *LAYOUT_RUNS]


def test_the_dry_run_prints_every_command_and_what_needs_more_gpus(two_gpus, tmp_path, capsys):
    out = tmp_path / "results"
    suite.main(["--runs", "tp2,tp4,dp2_kill,matrix_multi_gpu", "--out-dir", str(out), "--dry-run"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[suite] tp2: cadence serve --model qwen3-14b --load-format dummy --tp 2 ; "
                               "python -m benchmarks.load ")
    assert "--max-concurrency 1 --num-prompts 16 --label tp2" in lines[0]
    assert lines[1] == "[suite] tp4: not run: needs 4 GPUs, 2 visible"
    assert lines[2].startswith("[suite] tp4: cadence serve --model qwen3-14b --load-format dummy --tp 4 ; ")
    assert lines[3].startswith("[suite] dp2_kill: python -m benchmarks.fault_drill '--serve=--model "
                               "qwen3-14b --load-format dummy --dp 2' --kill 'cadence:executor dp=1 tp=0' "
                               "--kill-after 20")
    assert lines[4].startswith("[suite] matrix_multi_gpu: python -m benchmarks.generalization "
                               "--subset multi-gpu")
    assert not out.exists()  # nothing started, nothing written


def test_a_run_names_the_fp8_gemm_it_was_made_with_and_never_the_api_key(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("CADENCE_FP8_GEMM", "scaled_mm")
    monkeypatch.setenv("CADENCE_API_KEY", "secret-key")
    suite.main(["--runs", "c1_fp8", "--out-dir", str(tmp_path / "results"), "--dry-run"])
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("[suite] c1_fp8: CADENCE_FP8_GEMM=scaled_mm cadence serve --model qwen3-14b "
                           "--load-format dummy --quantization fp8 ; ")
    assert "secret-key" not in line


def test_runs_that_need_more_gpus_are_reported_not_run_and_the_suite_goes_on(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(devices, "visible_gpu_count", lambda: 1)
    suite.main(["--runs", ",".join(LAYOUT_RUNS), "--out-dir", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"[suite] {key}: not run: needs {run.gpus} GPUs, 1 visible"
                     for key, run in LAYOUT_RUNS.items()]
    assert list(tmp_path.iterdir()) == []


def test_the_report_has_a_section_per_layout_with_rows_not_run_until_they_run(tmp_path):
    report.main(["--results", str(REPORTS / "h200"), "--machine", "one H200", "--out-dir", str(tmp_path)])
    markdown = (tmp_path / "performance.md").read_text()
    figures = json.loads((tmp_path / "performance.json").read_text())
    assert list(figures["layouts"]) == list(LAYOUTS)
    rows = {row["run"]: row for section in figures["layouts"].values() for row in section}
    assert set(rows) == set(LAYOUT_RUNS)
    assert rows["tp4"]["result"] == "not run: needs 4 GPUs" and rows["tp4"]["met"] is None
    assert "0 of 15 runs made" in markdown
    for layout in LAYOUTS:
        assert f"### {layout} (" in markdown
    assert ("| dp8_gpus | 8 | total tok/s >= 0.95 x 8 x c302's (DP 1, one card of the same machine) | "
            "not run: needs 8 GPUs |  |") in markdown


def test_runs_that_are_there_are_held_to_their_goals(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    c1 = json.loads((REPORTS / "h200" / "c1.json").read_text())
    c302 = json.loads((REPORTS / "h200" / "c302.json").read_text())
    (results / "c302.json").write_text(json.dumps(c302))
    c1["tpot_ms"]["median"] = 4.1
    (results / "tp2.json").write_text(json.dumps(c1))
    c302["total_token_throughput"] *= 1.8  # two cards, 90 % of twice one
    (results / "dp2_gpus.json").write_text(json.dumps(c302))
    drill = json.loads((REPORTS / "h200" / "faults" / "drill_dp2_kill_executor.json").read_text())
    (results / "dp2_kill.json").write_text(json.dumps(drill))
    sweep = {"rows": [{"bytes": 2048, "custom_ok": True, "custom_us": 4.0, "nccl_us": 11.0},
                      {"bytes": 10240, "custom_ok": True, "custom_us": 4.5, "nccl_us": 11.5},
                      {"bytes": 1 << 20, "custom_ok": True, "custom_us": 40.0, "nccl_us": 30.0}],
             "crossover_bytes": 1 << 20, "command": "python -m benchmarks.all_reduce --ranks 2"}
    (results / "allreduce_tp2.json").write_text(json.dumps(sweep))
    report.main(["--results", str(REPORTS / "h200"), "--machine", "one H200", "--layout-results",
                 str(results), "--layout-machine", "two H100", "--out-dir", str(tmp_path)])
    rows = {row["run"]: row for section in json.loads((tmp_path / "performance.json").read_text())["layouts"]
            .values() for row in section}
    assert rows["tp2"]["met"] is True and "TPOT median 4.10 ms" in rows["tp2"]["result"]
    assert rows["dp2_gpus"]["met"] is False and "90.0% of 2 x c302" in rows["dp2_gpus"]["result"]
    assert rows["dp2_kill"]["met"] is True and rows["dp2_kill"]["result"].startswith("400 of 400 completed")
    assert rows["tp4"]["result"] == "not run: needs 4 GPUs"
    assert rows["allreduce_tp2"]["met"] is True
    assert rows["allreduce_tp2"]["result"] == ("10 KB: one-shot 4.5 us, NCCL 11.5 us; NCCL as fast from "
                                               "1,048,576 bytes up")
    markdown = (tmp_path / "performance.md").read_text()
    assert "4 of 15 runs made, on two H100." in markdown
    assert "Machine: one H200." in markdown  # the single-card rows still come from --results


def test_the_layout_sections_of_the_committed_report_match_what_the_report_would_write():
    figures = json.loads((REPORTS / "performance.json").read_text())
    assert figures["layouts"] == report.build({}, "")["layouts"]
    committed = (REPORTS / "performance.md").read_text()
    section = "\n".join(report.layout_markdown(figures["layouts"]))
    assert section in committed


def test_every_runs_server_flags_are_flags_cadence_serve_takes():
    # a run whose flags the CLI refuses starts no server: the suite said only "exited with 2"
    from api.cli import build_parser

    parser = build_parser()
    runs = {**{key: run.server_flags for key, run in suite.RUNS.items()},
            **{key: layout.server_flags for key, layout in LAYOUT_RUNS.items()}}
    for key, flags in runs.items():
        try:
            parser.parse_args(["serve", "--model", "qwen3-14b", "--load-format", "dummy", *flags])
        except SystemExit:
            pytest.fail(f"{key}: cadence serve refuses {flags}")


def test_replicas_meant_to_share_one_card_see_only_one(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    suite.main(["--runs", "prefix_burst_dp2,dp2", "--out-dir", str(tmp_path / "results"), "--dry-run"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[suite] prefix_burst_dp2: CUDA_VISIBLE_DEVICES=0 cadence serve --model "
                               "qwen3-14b --load-format dummy --dp 2 ; ")
    assert lines[1].startswith("[suite] dp2: CUDA_VISIBLE_DEVICES=0 cadence serve ")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert suite.run_environment(suite.RUNS["dp2"]) == {"CUDA_VISIBLE_DEVICES": "3"}
    assert suite.run_environment(suite.RUNS["c1"]) == {}
