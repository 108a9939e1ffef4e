"""The functional generalization matrix's CPU subset, run in this process against the real system.

Every cell must pass (each is a set of invariants: outputs equal across layouts, exact counts and
finish reasons, num_cached_tokens as the radix cache should give it, a balanced pool after every
cell), and the Markdown report must have one row per cell. The multi-gpu subset's layouts are
skipped, saying how many GPUs each needs, where fewer are visible. The rule that compares two runs
is specified on constructed outputs.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from api.generation import Generation
from benchmarks.generalization.compare import TIE_NATS, Tolerance, compare
from benchmarks.generalization.matrix import (
    Matrix,
    base_config,
    format_table,
    parse_args,
    pin_the_fp8_gemm,
    run_matrix,
)
from benchmarks.generalization.report import render_markdown
from benchmarks.generalization.server import Server
from benchmarks.generalization.server_plans import MULTI_GPU_LAYOUTS
from benchmarks.generalization.workload import Workload, make_shape
from ipc.messages import TopLogprob
from procs.args import launch_options_from_args

REPO = Path(__file__).resolve().parent.parent

# The module's fixture runs the whole CPU subset (8 servers) inside the first test's setup: 105 s on
# one 2-core machine, 238-300+ s on a slower one, against the suite's 300 s default. Each of its
# requests keeps the matrix's own timeouts (--request-timeout, --idle-timeout), so a hang still ends
# with a named cause well inside this bound.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def report() -> dict:
    return run_matrix(parse_args(["--subset", "cpu", "--device", "cpu"]))


def test_every_cell_of_the_cpu_subset_passes(report):
    failed = [f"{c['name']} ({c['server']}): {c['failure']}" for c in report["cells"] if not c["passed"]]
    assert not failed, "\n".join(failed) + "\n" + format_table(report)
    assert report["passed"]


def test_the_cpu_subset_covers_every_server_and_the_cache_cells(report):
    assert [s["name"] for s in report["servers"]] == ["reference", "prefix-cache", "chunked", "preemption",
                                                      "async", "async-preemption", "dp2", "tp2"]
    names = {c["name"] for c in report["cells"]}
    for wanted in ("prefix cache off", "prefix cache cold", "prefix cache hot",
                   "prefix cache partial-page hit", "prefix cache next turn", "prefix cache full-prompt hit",
                   "preemption (small pool)", "8 identical prompts at once (small pool)", "DP 2", "TP 2",
                   "batch 7", "seeded sampling", "stop string", "stop token id", "max_tokens",
                   "max_model_len", "async scheduling", "async scheduling, preemption (small pool)"):
        assert wanted in names
    for server in ("preemption", "async-preemption"):
        preemption = next(c for c in report["cells"] if c["server"] == server)
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


def _generation(ids: list[int], top: list[list[tuple[int, float]]], finish: str = "length") -> Generation:
    return Generation("r", token_ids=ids, finish_reason=finish, logprobs=[pairs[0][1] for pairs in top],
                      top_logprobs=[[TopLogprob(t, "", lp) for t, lp in pairs] for pairs in top])


BF16 = Tolerance.for_dtype("bfloat16")
FLOAT32 = Tolerance.for_dtype("float32")


def test_float32_runs_agree_only_with_equal_ids_and_close_logprobs():
    reference = _generation([5, 6], [[(5, -1.0), (9, -2.0)], [(6, -1.0), (9, -2.0)]])
    assert compare(reference, reference, FLOAT32).ok
    moved = _generation([5, 6], [[(5, -1.0), (9, -2.0)], [(6, -1.01), (9, -2.0)]])
    assert "logprob of token 1" in compare(reference, moved, FLOAT32).message
    other = _generation([5, 9], [[(5, -1.0), (9, -2.0)], [(9, -1.0), (6, -1.0)]])
    assert not compare(reference, other, FLOAT32).ok  # a tie is no excuse in float32


def test_bf16_divergence_is_accepted_only_at_a_near_tie_of_the_two_tokens():
    reference = _generation([5, 6, 7],
                            [[(5, -1.0), (9, -3.0)], [(6, -1.00), (8, -1.03)], [(7, -1.0), (1, -2.0)]])
    tie = _generation([5, 8, 2], [[(5, -1.0), (9, -3.0)], [(8, -1.01), (6, -1.02)], [(2, -1.0), (1, -2.0)]])
    agreement = compare(reference, tie, BF16)
    assert agreement.ok and "near-tie" in agreement.message
    wide = _generation([5, 8, 2], [[(5, -1.0), (9, -3.0)], [(8, -1.0), (6, -1.4)], [(2, -1.0), (1, -2.0)]])
    assert "0.4 nats apart" in compare(reference, wide, BF16).message  # beyond the 0.35-nat tolerance
    third = _generation([5, 4, 2], [[(5, -1.0), (9, -3.0)], [(4, -1.0), (6, -1.01)], [(2, -1.0), (1, -2.0)]])
    # the reference's top logprobs at token 1 reach 0.03 nats under its best and do not hold 4
    assert ("reference's top 2 at token 1 (down to 0.03 nats under its best) do not hold both tokens 6 "
            "and 4") in compare(reference, third, BF16).message
    shorter = _generation([5, 8], [[(5, -1.0), (9, -3.0)], [(8, -1.01), (6, -1.02)]])
    assert "2 tokens where the reference has 3" in compare(reference, shorter, BF16).message


def test_a_divergence_beyond_a_runs_top_logprobs_is_scored_again_teacher_forced():
    """The reference's top 2 reach 0.03 nats under its best and miss this run's token 4: the runs
    cannot tell, so the position is scored again; a top that reaches past the tolerance can."""
    reference = _generation([5, 6], [[(5, -1.0), (9, -3.0)], [(6, -1.00), (8, -1.03)]])
    actual = _generation([5, 4], [[(5, -1.0), (9, -3.0)], [(4, -1.0), (6, -1.01)]])
    asked = []

    def score(gaps):
        def scorer(position, tokens):
            asked.append((position, tokens))
            return gaps
        return scorer

    agreement = compare(reference, actual, BF16, score=score({6: 0.0, 4: 0.2}))
    assert agreement.ok and "teacher-forced, 6 0, 4 0.2 nats under the best" in agreement.message
    assert asked == [(1, (6, 4))]  # the reference's token first, at the first differing position
    refused = compare(reference, actual, BF16, score=score({6: 0.0, 4: 0.5}))
    assert "teacher-forced, the tokens lie 6 0, 4 0.5 nats under the best (> 0.35)" in refused.message
    assert "nothing scores the position again" in compare(reference, actual, BF16).message

    def broken(position, tokens):
        raise RuntimeError("the server is gone")
    assert "scoring it again failed: RuntimeError: the server is gone" in compare(
        reference, actual, BF16, score=broken).message
    deep = _generation([5, 6], [[(5, -1.0), (9, -3.0)], [(6, -1.00), (8, -1.5)]])  # 0.5 deep: 4 is farther
    asked.clear()
    assert "down to 0.5 nats under its best" in compare(deep, actual, BF16, score=score({})).message
    assert asked == []  # no third computation where a run already says no


def test_score_next_gives_the_decodes_own_logprobs_teacher_forced():
    """On the CPU (float32) a teacher-forced score of a position equals what decoding computed there:
    the greedy token 0 nats under the best, the second-best as far under as the decode's top logprobs say."""
    args = parse_args(["--subset", "cpu", "--device", "cpu"])
    config = base_config(args)
    workload = Workload(make_shape("cpu", config.cache.block_size, config.max_model_len))
    job = workload.length_job(17, 8)
    with Server("score", config, launch_options_from_args(args), request_timeout_s=120) as server:
        generation = server.run([job])[job.key]
        for position in (0, 5):
            token, (best, second) = generation.token_ids[position], generation.top_logprobs[position][:2]
            assert best.token_id == token
            gaps = server.score_next(job.key, generation.token_ids[:position], (token, second.token_id))
            assert gaps[token] == pytest.approx(0.0, abs=1e-4)
            assert gaps[second.token_id] == pytest.approx(best.logprob - second.logprob, abs=1e-3)
        with pytest.raises(KeyError, match="ran no job"):
            server.score_next("never/run", [], (1,))


def test_fp8_activations_get_the_wider_measured_tie_and_the_cpu_keeps_the_exact_rule():
    fp8 = Tolerance.for_dtype("bfloat16", quantization="fp8")
    assert fp8.tie_nats == 3.0 and not fp8.exact
    assert Tolerance.for_dtype("float32", quantization="fp8").exact
    assert Tolerance.for_dtype("bfloat16", tie_nats=0.5, quantization="fp8").tie_nats == 0.5  # as asked
    reference = _generation([5, 6], [[(5, -1.0), (9, -3.0)], [(6, -1.0), (8, -1.8)]])
    drifted = _generation([5, 8], [[(5, -1.0), (9, -3.0)], [(8, -1.0), (6, -3.3)]])  # 2.3 apart
    assert not compare(reference, drifted, BF16).ok
    assert compare(reference, drifted, fp8).ok
    far = _generation([5, 8], [[(5, -1.0), (9, -3.0)], [(8, -1.0), (6, -4.5)]])
    assert "3.5 nats apart" in compare(reference, far, fp8).message


def test_the_multi_gpu_subset_skips_each_layout_without_its_cards_saying_how_many_it_needs(capsys):
    args = parse_args(["--subset", "multi-gpu", "--device", "cpu", "--model", "qwen3-14b"])  # 8 KV heads
    base = base_config(args)
    workload = Workload(make_shape(args.subset, base.cache.block_size, base.max_model_len))
    matrix = Matrix(args, base, workload, Tolerance.for_dtype(base.model.dtype, 1e-3, 0.35))
    assert [p.name for p in matrix.plans] == ["reference", *MULTI_GPU_LAYOUTS]
    for plan in matrix.plans[1:]:
        matrix.run_server(plan)  # no server starts: the CPU has no GPU to give any layout
    report = matrix.report()
    gpus = {c["server"]: c["skipped"] for c in report["cells"]}
    assert gpus["tp2"] == "not run: needs 2 GPUs, 0 visible"
    assert gpus["dp2tp2"] == gpus["tp4"] == "not run: needs 4 GPUs, 0 visible"
    assert gpus["dp8"] == "not run: needs 8 GPUs, 0 visible"
    assert "[tp8] not run: needs 8 GPUs, 0 visible" in capsys.readouterr().out
    assert report["num_skipped"] == len(MULTI_GPU_LAYOUTS) and report["num_passed"] == 0
    assert not report["passed"]  # nothing ran
    assert "TP 2, async scheduling on 2 GPUs" in format_table(report)
    assert f"{len(MULTI_GPU_LAYOUTS)} not run (too few GPUs visible" in render_markdown(report)


def test_an_fp8_matrix_on_a_gpu_multiplies_alike_at_every_row_count_unless_told_otherwise(monkeypatch):
    monkeypatch.setenv("CADENCE_FP8_GEMM", "")  # remembers the variable's state, restored after the test
    monkeypatch.delenv("CADENCE_FP8_GEMM")
    cpu = base_config(parse_args(["--subset", "cpu", "--device", "cpu", "--quantization", "fp8"]))
    pin_the_fp8_gemm(cpu)
    assert "CADENCE_FP8_GEMM" not in os.environ  # the CPU serves FP8 through dequantized weights
    pin_the_fp8_gemm(replace(cpu, device="cuda"))
    assert os.environ["CADENCE_FP8_GEMM"] == "scaled_mm"
    monkeypatch.setenv("CADENCE_FP8_GEMM", "row_gemv")  # named: kept
    pin_the_fp8_gemm(replace(cpu, device="cuda"))
    assert os.environ["CADENCE_FP8_GEMM"] == "row_gemv"
    bf16 = base_config(parse_args(["--subset", "cpu", "--device", "cpu"]))
    monkeypatch.delenv("CADENCE_FP8_GEMM")
    pin_the_fp8_gemm(replace(bf16, device="cuda"))
    assert "CADENCE_FP8_GEMM" not in os.environ


def test_a_layout_the_model_refuses_is_not_run_and_says_why():
    # qwen3-tiny's k and v projections are 128 rows: TP 2 would split its 128 x 128 FP8 blocks
    args = parse_args(["--subset", "cpu", "--device", "cpu", "--quantization", "fp8"])
    base = base_config(args)
    workload = Workload(make_shape(args.subset, base.cache.block_size, base.max_model_len))
    matrix = Matrix(args, base, workload, Tolerance.for_dtype(base.model.dtype, 1e-3, 0.35))
    plans = {plan.name: plan for plan in matrix.plans}
    assert not plans["dp2"].refused and "FP8" in plans["tp2"].refused
    matrix.run_server(plans["tp2"])  # starts no server
    (cell,) = matrix.report()["cells"]
    assert cell["server"] == "tp2" and cell["passed"] is None
    assert cell["skipped"].startswith("not run: model qwen3-tiny in FP8: tp_size 2")


def test_a_structured_outputs_divergence_is_judged_on_the_two_chosen_tokens():
    # the grammar allowed tokens far below the top: the chosen ones are not among the top logprobs
    top = [(1, -9.0), (2, -9.1)]
    reference = Generation("r", token_ids=[5, 6, 7], finish_reason="stop", logprobs=[-11.0, -11.2, -12.0],
                           top_logprobs=[[TopLogprob(t, "", lp) for t, lp in top]] * 3)
    tie = Generation("r", token_ids=[5, 8], finish_reason="stop", logprobs=[-11.0, -11.3],
                     top_logprobs=[[TopLogprob(t, "", lp) for t, lp in top]] * 2)
    assert not compare(reference, tie, BF16).ok  # the plain rule cannot see them
    agreement = compare(reference, tie, BF16, constrained=True)
    assert agreement.ok and "near-tie" in agreement.message  # and the length may then differ
    far = Generation("r", token_ids=[5, 8], finish_reason="stop", logprobs=[-11.0, -12.0],
                     top_logprobs=tie.top_logprobs)
    assert "0.8 nats apart" in compare(reference, far, BF16, constrained=True).message
    assert not compare(reference, tie, FLOAT32, constrained=True).ok  # float32 stays exact


def test_the_near_tie_tolerances_accept_every_flip_the_committed_noise_measurement_found():
    """TIE_NATS rests on `python -m benchmarks.fp8_near_ties` (docs/reports/h100/fp8/near_ties/):
    every greedy flip that a correct change of the computation made there must be a near-tie."""
    measured = sorted((REPO / "docs/reports/h100/fp8/near_ties").glob("*.json"))
    assert measured
    for path in measured:
        runs = json.loads(path.read_text())
        for quantization, tie_nats in (("fp8", TIE_NATS["fp8"]), ("bf16", TIE_NATS[None])):
            for variant, figures in runs.get(quantization, {}).items():
                farthest = max(figures["flip_gaps_largest"], default=0.0)
                assert 0.0 < farthest <= tie_nats, (path.name, quantization, variant, farthest)
