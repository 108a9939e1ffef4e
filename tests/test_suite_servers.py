"""When `benchmarks.suite` starts a fresh server: for other server flags, and for a run that repeats
prompts the running server has already served, unless the run is there to find them in the prefix
cache. A run that finds its prompts cached by accident measures the cache, not its workload."""

from __future__ import annotations

import pytest

from benchmarks import suite


@pytest.fixture
def servers(monkeypatch):
    started: list[str] = []

    class FakeServer:
        def __init__(self, flags, port, log_path, startup_s, env=None):
            started.append(log_path.rsplit("server_", 1)[1].removesuffix(".log"))

        def stop(self) -> None:
            pass

    monkeypatch.setattr(suite, "Server", FakeServer)
    monkeypatch.setattr(suite.subprocess, "run", lambda *args, **kwargs: None)
    monkeypatch.setattr(suite, "_annotate", lambda *args, **kwargs: None)
    return started


@pytest.mark.parametrize("runs,fresh", [
    ("c1_fp8,c1_fp8_defaults", ["c1_fp8", "c1_fp8_defaults"]),  # one server's flags, c1's prompts twice
    ("c1,c302", ["c1"]),  # one server, prompts of their own
    ("c1,c1_fp8,c1", ["c1", "c1_fp8", "c1"]),  # other flags, then c1's flags again
    ("c128_warm,c128_cached,c128_cached_defaults", ["c128_warm"]),  # the cached runs want the cache
])
def test_a_run_gets_a_fresh_server_for_other_flags_or_prompts_already_served(servers, tmp_path, runs, fresh):
    suite.main(["--runs", runs, "--out-dir", str(tmp_path)])
    assert servers == fresh


def test_only_the_runs_that_repeat_a_warm_up_expect_cache_hits():
    expecting = {key for key, run in suite.RUNS.items() if run.expects_cache_hits}
    assert expecting == {"c128_cached", "c128_cached_defaults"}
    for key in expecting:
        assert suite.RUNS[key].prompts_of == "c128_warm"
