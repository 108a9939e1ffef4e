"""`python -m benchmarks.soak` in miniature: it starts its own server, and every target passes."""

from __future__ import annotations

import json

from benchmarks.soak import run as soak


def test_short_soak_meets_every_target_and_exercises_drops_and_refusals(tmp_path):
    out = tmp_path / "soak.json"
    argv = ["--num-requests", "60", "--concurrency", "8", "--warmup", "20", "--progress-every", "20",
            "--max-tokens", "8", "--max-prompt-tokens", "200",  # a quick run on two cores
            "--server-log", str(tmp_path / "server.log"), "--output", str(out)]
    result = soak.main(argv)

    failed = {name: t for name, t in result["targets"].items() if not t["passed"]}
    assert not failed, (failed, result["failures"])
    counts = result["counts"]
    assert sum(counts.values()) == 60
    assert counts["ok"] > 0 and counts["disconnected"] > 0 and counts["refused"] > 0
    answered_ok = {shape.split()[1] for shape, outcomes in result["by_shape"].items() if outcomes.get("ok")}
    assert answered_ok == {"completion", "chat", "responses", "messages"}  # every API among the calls
    rss_target = "RSS growth (trend after the warm-up), worst process %"
    assert {"pages held beyond the cache", "router load tokens", rss_target, "clean shutdown"} <= set(
        result["targets"])
    assert result["shutdown"]["signals"] == ["SIGINT"]
    assert json.loads(out.read_text())["passed"] is True
