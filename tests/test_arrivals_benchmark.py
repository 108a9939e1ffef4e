"""`python -m benchmarks.arrivals` runs end to end on a small burst and writes its figures."""

from __future__ import annotations

import json

import pytest

from benchmarks import arrivals


def test_arrivals_benchmark_times_every_part_and_writes_json(tmp_path, capsys):
    out = tmp_path / "arrivals.json"
    arrivals.main(["--prompt-len", "300", "--burst", "6", "--threads", "2", "--out", str(out)])
    figures = json.loads(out.read_text())
    assert figures["burst"] == 6 and figures["threads"] == 2
    assert 250 <= figures["prompt_tokens"] <= 400  # random ids re-encode to about as many tokens
    for key in ("tokenize_burst_serial_ms", "tokenize_burst_threads_ms", "wire_encode_us", "wire_decode_us",
                "scheduler_admit_us"):
        assert figures[key] > 0, key
    assert figures["wire_bytes"] > 300  # the ids travel as JSON numbers
    assert "tokenize the burst, 2 threads" in capsys.readouterr().out


def test_arrivals_benchmark_refuses_an_empty_burst():
    with pytest.raises(SystemExit, match="must be at least 1"):
        arrivals.main(["--burst", "0"])
