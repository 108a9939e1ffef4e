"""benchmarks/long_context.py: a prompt at the whole YaRN context served through the processes, its
repeat and a branch of it served from the radix cache, one token past the context refused while the
engine keeps serving (qwen3-tiny on the CPU; the 14B shape runs on a GPU, docs/reports)."""

from __future__ import annotations

import json

from benchmarks.long_context import run

YARN = {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}}


def test_a_prompt_at_four_times_the_original_context_is_served_cached_and_bounded():
    flags = ["--device", "cpu", "--load-format", "dummy", "--hf-overrides", json.dumps(YARN)]
    result = run("qwen3-tiny", flags, context=1_024, max_tokens=8, branch_tokens=100, seed=1)
    rows = {row["name"]: row for row in result["rows"]}
    for name in ("fresh", "cached", "branched"):
        row = rows[name]
        assert row["ok"] and row["output_tokens"] == 8 and row["logprobs_finite"], row
        assert row["prompt_tokens"] == 1_016
        assert 0 < row["ttft_s"] <= row["wall_s"]
    assert rows["fresh"]["cached_tokens"] == 0
    assert rows["cached"]["cached_tokens"] >= 1_016 - 16  # all but the last, partly filled page
    assert 1_016 - 100 - 16 <= rows["branched"]["cached_tokens"] <= 1_016 - 100
    assert rows["too_long"]["refused"] and "1024" in rows["too_long"]["refused"]
    assert result["serving_after_refusal"]
    assert result["cached_tokens_equal_fresh"]  # float32 on the CPU: the cache changes nothing
