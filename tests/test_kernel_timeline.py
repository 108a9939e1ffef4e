"""benchmarks/lib/kernel_timeline.py: the lead, busy time, gaps and tail of a step's timeline."""

from benchmarks.lib.kernel_timeline import format_timeline, summarize


def test_summarize_splits_the_span_into_lead_busy_gaps_and_tail():
    host = [(0.0, 120.0, "execute"), (95.0, 110.0, "aten::copy_")]
    kernels = [(10.0, 30.0, "gemm"), (25.0, 40.0, "quantize"),  # overlapping (dependent launch)
               (43.0, 50.0, "norm"), (100.0, 112.0, "sampler")]
    t = summarize(kernels, host)
    assert t["kernels"] == 4
    assert t["lead_ms"] * 1e3 == 10.0
    assert t["busy_ms"] * 1e3 == (40 - 10) + (50 - 43) + (112 - 100)
    assert t["gap_ms"] * 1e3 == 3.0 + 50.0
    assert t["tail_ms"] * 1e3 == 120 - 112
    assert abs(t["span_ms"] - (t["lead_ms"] + t["busy_ms"] + t["gap_ms"] + t["tail_ms"])) < 1e-9
    assert t["gap_counts"] == {"<2us": 0, "<5us": 1, "<20us": 0, "<100us": 1, "<1000us": 0, ">=1000us": 0}
    biggest = t["largest_gaps"][0]
    assert (biggest["us"], biggest["after"], biggest["before"]) == (50.0, "norm", "sampler")
    assert biggest["host_running"] == ["aten::copy_", "execute"]  # what ran when the sampler was launched
    assert "lead 0.01" in format_timeline("step", t)


def test_summarize_without_kernels():
    assert summarize([], [(0.0, 1.0, "execute")]) == {"kernels": 0}
    assert format_timeline("step", {"kernels": 0}) == "step: no kernels seen"
