"""`python -m benchmarks.load` against a real system on the CPU: counts, keys, hit rates, plots, --help."""

from __future__ import annotations

import json

import pytest
from api_http import UvicornThread
from system_client import tiny_config

from api.protocol import ServedModel
from api.server import ApiConfig, build_app
from benchmarks import load
from benchmarks.lib.backends import Sampling, ZmqBackend
from benchmarks.lib.datasets import ideal_prefix_hit_rate, random_dataset, shared_prefix_dataset
from procs.launcher import Launcher, LaunchOptions

REQUIRED_KEYS = (
    "completed",
    "failed",
    "duration_s",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_token_throughput",
    "ttft_ms",
    "tpot_ms",
    "itl_ms",
    "e2e_ms",
    "max_concurrency_reached",
    "prefix_cache_hit_rate",
    "kv_cache_usage",
    "requests",
)


@pytest.fixture(scope="module")
def system():
    """The system on the CPU, with the REST server in front of it: (tokenizer address, HTTP port)."""
    config = tiny_config(max_model_len=1024, num_pages=1024)
    with Launcher(config, LaunchOptions(startup_timeout_s=120)) as launcher:
        address = launcher.endpoints.tokenizer_frontend
        model = ServedModel(config.model.name, config.max_model_len, config.model.generation)
        with UvicornThread(build_app(ApiConfig(model, address, timeout_s=60))) as http:
            yield address, http.port


@pytest.fixture(scope="module")
def server(system):
    return system[0]


def _run(address: str, *flags: str) -> dict:
    return load.main(["--backend", "zmq", "--zmq-address", address, "--no-progress", "--warmup", "1", *flags])


def test_random_workload_costs_exactly_what_it_says(server, tmp_path):
    out = tmp_path / "r.json"
    flags = "--dataset random --num-prompts 12 --input-len 40 --output-len 6 --max-concurrency 4"
    result = _run(server, *flags.split(), "--out", str(out), "--plots", str(tmp_path / "plots"))
    assert json.loads(out.read_text())["completed"] == 12
    for key in REQUIRED_KEYS:
        assert key in result, key
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(result[name]) == {"mean", "median", "p90", "p99", "max"}
        assert 0 < result[name]["median"] <= result[name]["max"]
    assert result["failed"] == 0
    assert result["total_input_tokens"] == 12 * 40 and result["total_output_tokens"] == 12 * 6
    assert result["max_concurrency_reached"] == 4
    assert result["ttft_ms"]["max"] <= result["e2e_ms"]["max"]
    assert result["kv_cache_usage"]["samples"] >= 1
    wait = result["step_wait"]  # the executors' time between back-to-back steps, from the server's counters
    assert wait["execute_s"] > 0 and wait["wait_s"] > 0 and 0 < wait["fraction"] < 1
    assert sum(result["output_tokens_per_second"]) == 12 * 6
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["latency_cdf.png", "throughput_kv.png"]


def test_shared_prefix_workload_hits_the_cache_when_groups_arrive_over_time(server):
    flags = ("--dataset shared-prefix --groups 2 --prompts-per-group 4 --system-len 64 --question-len 8 "
             "--output-len 2 --max-concurrency 1")
    result = _run(server, *flags.split())
    ideal = ideal_prefix_hit_rate(2, 4, 64, 8, 16)
    assert result["completed"] == 8
    assert result["prefix_cache_hit_rate"] == pytest.approx(ideal, abs=0.02)
    assert result["ideal_prefix_cache_hit_rate"] == pytest.approx(ideal)


def test_http_backend_reports_the_same_counts_and_reads_the_hit_rate_from_metrics(system):
    _, port = system
    common = ["--backend", "http", "--base-url", f"http://127.0.0.1:{port}", "--no-progress", "--warmup", "1"]
    result = load.main([*common, "--dataset", "random", "--num-prompts", "8", "--input-len", "24",
                        "--output-len", "5", "--max-concurrency", "3"])
    assert result["completed"] == 8 and result["failed"] == 0
    assert result["total_input_tokens"] == 8 * 24 and result["total_output_tokens"] == 8 * 5
    assert result["max_concurrency_reached"] == 3 and result["kv_cache_usage"]["samples"] >= 1
    assert result["step_wait"]["execute_s"] > 0 and 0 < result["step_wait"]["fraction"] < 1
    shared = load.main([*common, "--dataset", "shared-prefix", "--groups", "2", "--prompts-per-group", "3",
                        "--system-len", "48", "--question-len", "8", "--output-len", "2",
                        "--max-concurrency", "1", "--seed", "3"])
    ideal = ideal_prefix_hit_rate(2, 3, 48, 8, 16)
    assert shared["prefix_cache_hit_rate"] == pytest.approx(ideal, abs=0.02)


def test_flush_cache_makes_a_repeated_run_start_as_cold_as_the_first(system):
    """The same shared-prefix run four times: cold, then hot (every prompt cached whole), then after
    --flush-cache on each backend as cold as the first."""
    address, port = system
    zmq = ["--backend", "zmq", "--zmq-address", address]
    http = ["--backend", "http", "--base-url", f"http://127.0.0.1:{port}"]
    flags = ["--no-progress", "--warmup", "1", "--dataset", "shared-prefix", "--groups", "2",
             "--prompts-per-group", "3", "--system-len", "48", "--question-len", "8", "--output-len", "2",
             "--max-concurrency", "1", "--seed", "11"]
    ideal = ideal_prefix_hit_rate(2, 3, 48, 8, 16)
    cold = load.main([*zmq, *flags])
    hot = load.main([*zmq, *flags])
    assert cold["prefix_cache_hit_rate"] == pytest.approx(ideal, abs=0.02)
    assert hot["prefix_cache_hit_rate"] > ideal + 0.2 and not hot["flushed_cache"]
    for backend in (zmq, http):
        flushed = load.main([*backend, *flags, "--flush-cache"])
        assert flushed["prefix_cache_hit_rate"] == pytest.approx(ideal, abs=0.02), backend
        assert flushed["flushed_cache"]


def test_multi_turn_conversations_extend_their_history(server):
    result = _run(server, "--dataset", "multi-turn", "--conversations", "2", "--turns", "3",
                  "--output-len", "4")
    assert result["completed"] == 6
    by_turn = sorted(r["prompt_tokens"] for r in result["requests"])
    assert by_turn[-1] > by_turn[0]  # later turns carry the history
    assert result["prefix_cache_hit_rate"] > 0.2


def test_datasets_have_the_asked_shapes():
    specs = random_dataset(50, 100, 10, 0.5, seed=1)
    assert all(50 <= s.prompt_len <= 150 and 5 <= s.output_len <= 15 for s in specs)
    shared = shared_prefix_dataset(3, 5, 32, 4, 7, seed=2)
    assert len(shared) == 15 and {s.prompt_len for s in shared} == {36}
    by_group = {}
    for s in shared:
        by_group.setdefault(s.group, set()).add(tuple(s.prompt_token_ids[:32]))
    assert all(len(prefixes) == 1 for prefixes in by_group.values())


def test_help_explains_every_flag():
    parser = load.build_parser()
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and len(action.help) > 10, f"{action.option_strings} has no help"


def test_sampling_is_greedy_unless_asked_and_model_defaults_send_nothing():
    assert Sampling().fields() == {"temperature": 0.0}
    assert Sampling("model-defaults").fields() == {}
    assert Sampling("model-defaults", top_k=5).fields() == {"top_k": 5}
    assert Sampling("greedy", temperature=0.6, top_p=0.95, top_k=20).fields() == {
        "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    with pytest.raises(ValueError, match="model-defaults needs the http backend"):
        ZmqBackend("ipc:///nowhere", 1.0, Sampling("model-defaults"))
    with pytest.raises(SystemExit, match="model-defaults needs the http backend"):
        load.main(["--backend", "zmq", "--zmq-address", "ipc:///nowhere", "--sampling", "model-defaults"])


def test_a_run_at_the_model_defaults_and_a_seeded_one_are_recorded_as_such(system):
    address, port = system
    common = ["--dataset", "random", "--num-prompts", "6", "--input-len", "16", "--output-len", "4",
              "--max-concurrency", "3", "--no-progress", "--warmup", "1"]
    http = load.main(["--backend", "http", "--base-url", f"http://127.0.0.1:{port}", "--sampling",
                      "model-defaults", *common])
    assert http["completed"] == 6 and http["failed"] == 0
    assert http["sampling"] == {"mode": "model-defaults", "sent": {}}
    native = _run(address, "--temperature", "0.6", "--top-p", "0.95", "--top-k", "20", *common)
    assert native["completed"] == 6
    assert native["sampling"] == {"mode": "greedy", "sent": {"temperature": 0.6, "top_p": 0.95, "top_k": 20}}


def test_extra_body_goes_into_every_http_request_and_the_record(system):
    address, port = system
    common = ["--dataset", "random", "--num-prompts", "4", "--input-len", "16", "--output-len", "6",
              "--max-concurrency", "2", "--no-progress", "--warmup", "1"]
    choices = {"guided_choice": ["yes", "no"], "ignore_eos": False}
    http = load.main(["--backend", "http", "--base-url", f"http://127.0.0.1:{port}", "--extra-body",
                      json.dumps(choices), *common])
    assert http["completed"] == 4 and http["extra_body"] == choices
    assert http["total_output_tokens"] <= 4 * 3  # "yes" or "no" and the end: the choice was enforced
    with pytest.raises(SystemExit, match="http backend"):
        _run(address, "--extra-body", json.dumps(choices), *common)
    with pytest.raises(SystemExit, match="JSON object"):
        load.main(["--backend", "http", "--extra-body", "[1]", *common])


@pytest.mark.parametrize("kind, output_len", [("grammar", 40), ("regex", 40), ("choice", 8), ("json", 200)])
def test_structured_runs_count_the_replies_that_conform(system, kind, output_len):
    """vLLM's structured-output benchmark's four kinds: every reply (constrained, EOS ignored as the
    load tool does, so the text is what the grammar allowed) must conform, checked independently."""
    _, port = system
    result = load.main(["--backend", "http", "--base-url", f"http://127.0.0.1:{port}", "--structured", kind,
                        "--dataset", "random", "--num-prompts", "4", "--input-len", "16", "--output-len",
                        str(output_len), "--max-concurrency", "4", "--no-progress", "--warmup", "0"])
    assert result["completed"] == 4 and result["extra_body"]
    structured = result["structured"]
    assert structured["checked"] == 4 and structured["correct"] == 4, structured["wrong_examples"]


@pytest.mark.parametrize("endpoint", ["responses", "messages"])
def test_the_agent_apis_carry_a_load_with_its_counts_hits_and_history(system, endpoint):
    """--endpoint responses / messages: the random run's exact output counts, a shared prefix (sent
    as text) hitting the cache, multi-turn conversations growing, and the runs recorded as such."""
    _, port = system
    common = ["--backend", "http", "--base-url", f"http://127.0.0.1:{port}", "--endpoint", endpoint,
              "--no-progress", "--warmup", "1"]
    result = load.main([*common, "--dataset", "random", "--num-prompts", "8", "--input-len", "24",
                        "--output-len", "5", "--max-concurrency", "4"])
    assert result["completed"] == 8 and result["failed"] == 0, result["errors"]
    assert result["total_output_tokens"] == 8 * 5 and result["endpoint"] == endpoint
    assert all(r["prompt_tokens"] >= 24 for r in result["requests"])  # words, and the chat template
    assert result["ttft_ms"]["max"] <= result["e2e_ms"]["max"] and result["tpot_ms"]["median"] > 0
    shared = load.main([*common, "--dataset", "shared-prefix", "--groups", "2", "--prompts-per-group", "4",
                        "--system-len", "64", "--question-len", "8", "--output-len", "2",
                        "--max-concurrency", "1", "--seed", "5"])
    assert shared["completed"] == 8 and shared["prefix_cache_hit_rate"] > 0.4
    assert sum(r["cached_tokens"] for r in shared["requests"]) > 0  # read from the API's usage
    turns = load.main([*common, "--dataset", "multi-turn", "--conversations", "2", "--turns", "3",
                       "--output-len", "4"])
    assert turns["completed"] == 6
    by_turn = sorted(r["prompt_tokens"] for r in turns["requests"])
    assert by_turn[-1] > by_turn[0]


def test_the_agent_endpoints_are_refused_where_they_cannot_go(system):
    address, _ = system
    with pytest.raises(SystemExit, match="needs --endpoint openai"):
        load.main(["--backend", "http", "--endpoint", "messages", "--structured", "json"])
    with pytest.raises(SystemExit, match="for the http backend"):
        _run(address, "--endpoint", "responses")
