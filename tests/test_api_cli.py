"""`cadence serve` (api/cli.py): its flags, and the wiring from flags to launcher to a serving app.

The launcher is replaced by one that "starts" the fake tokenizer, so these tests check the CLI's
own work: flags parsed, the engine config built by procs.args, the served model name, the API key
(flag or environment), and an app that answers over HTTP.
"""

from __future__ import annotations

import contextlib
import socket
from types import SimpleNamespace

import pytest
from api_fake_tokenizer import FakeTokenizer
from api_http import UvicornThread, get, post
from free_ports import free_port

from api import cli
from api.protocol import ServedModel
from core.config import EngineConfig
from core.generation_defaults import GenerationDefaults


def test_serve_flags_and_their_defaults():
    args = cli.build_parser().parse_args(["serve"])
    assert (args.command, args.host, args.port, args.api_key, args.served_model_name) == (
        "serve", "127.0.0.1", 8000, None, None)
    args = cli.build_parser().parse_args([
        "serve", "--host", "0.0.0.0", "--port", "9001", "--api-key", "k", "--served-model-name", "tiny",
        "--model", "qwen3-tiny", "--tp", "1"])
    assert (args.host, args.port, args.api_key, args.served_model_name, args.model) == (
        "0.0.0.0", 9001, "k", "tiny", "qwen3-tiny")


def test_vllm_and_sglang_function_calling_flags_are_accepted(capsys):
    parse = cli.build_parser().parse_args
    args = parse(["serve", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    assert args.enable_auto_tool_choice and args.tool_call_parser == "hermes"
    assert parse(["serve", "--tool-call-parser", "qwen25"]).tool_call_parser == "qwen25"
    with pytest.raises(SystemExit):
        parse(["serve", "--tool-call-parser", "mistral"])
    assert "invalid choice: 'mistral'" in capsys.readouterr().err


def test_vllm_and_sglang_reasoning_flags_are_accepted(capsys):
    parse = cli.build_parser().parse_args
    assert parse(["serve"]).reasoning_parser == "qwen3"
    args = parse(["serve", "--enable-reasoning", "--reasoning-parser", "deepseek_r1"])
    assert args.enable_reasoning and args.reasoning_parser == "deepseek_r1"
    with pytest.raises(SystemExit):
        parse(["serve", "--reasoning-parser", "granite"])
    assert "invalid choice: 'granite'" in capsys.readouterr().err


def test_vllm_flags_that_change_nothing_here_are_accepted():
    args = cli.build_parser().parse_args(["serve", "--trust-remote-code", "--disable-log-requests",
                                          "--disable-log-stats"])
    assert args.trust_remote_code and args.disable_log_requests and args.disable_log_stats


def test_an_sglang_command_line_makes_the_config_its_vllm_twin_makes():
    from procs.args import config_from_args

    parse = cli.build_parser().parse_args
    sglang = parse(["serve", "--model-path", "qwen3-tiny", "--context-length", "2048", "--tp-size", "2",
                    "--dp-size", "2", "--mem-fraction-static", "0.8", "--max-running-requests", "64",
                    "--chunked-prefill-size", "4096", "--disable-radix-cache", "--device", "cpu"])
    vllm = parse(["serve", "--model", "qwen3-tiny", "--max-model-len", "2048", "--tensor-parallel-size", "2",
                  "--data-parallel-size", "2", "--gpu-memory-utilization", "0.8", "--max-num-seqs", "64",
                  "--max-num-batched-tokens", "4096", "--no-enable-prefix-caching", "--device", "cpu"])
    config = config_from_args(sglang)
    assert config == config_from_args(vllm)
    assert (config.parallel.tp_size, config.parallel.dp_size, config.max_model_len) == (2, 2, 2048)
    assert not config.cache.enable_prefix_caching and config.cache.gpu_memory_utilization == 0.8


def test_max_logprobs_reaches_the_engine_config_and_a_negative_one_is_refused():
    from core.config import ConfigError
    from procs.args import config_from_args

    parse = cli.build_parser().parse_args
    assert config_from_args(parse(["serve"])).scheduler.max_logprobs == 20
    assert config_from_args(parse(["serve", "--max-logprobs", "100"])).scheduler.max_logprobs == 100
    with pytest.raises(ConfigError, match="max_logprobs must be >= 0, got -1"):
        config_from_args(parse(["serve", "--max-logprobs", "-1"]))


def test_a_command_is_required():
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([])


class FakeLauncher:
    """Stands in for procs.launcher.Launcher: records what it was given, points at the fake."""

    started: list = []
    address = ""

    def __init__(self, config, options=None, on_fatal=None):
        self.config, self.options, self.on_fatal = config, options, on_fatal
        self.endpoints = SimpleNamespace(tokenizer_frontend=FakeLauncher.address)

    def __enter__(self):
        FakeLauncher.started.append(self)
        return self

    def __exit__(self, *exc):
        self.stopped = True


@pytest.fixture
def served(monkeypatch):
    """Runs `cadence serve` with the fake launcher; yields what the HTTP checks saw."""
    seen = {}

    def run_http(app, args, watch, http_socket):
        with UvicornThread(app) as server:
            seen["args"] = args
            seen["models_open"] = get(server.port, "/v1/models")
            seen["models_keyed"] = get(server.port, "/v1/models", headers={"Authorization": "Bearer k1"})
            seen["completion"] = post(server.port, "/v1/completions", {"prompt": "hi", "max_tokens": 2},
                                      headers={"Authorization": "Bearer k1"})
            seen["health"] = get(server.port, "/health")

    with FakeTokenizer(model="served-name") as fake:
        FakeLauncher.address, FakeLauncher.started = fake.address, []
        monkeypatch.setattr("procs.launcher.Launcher", FakeLauncher)
        monkeypatch.setattr(cli, "_run_http", run_http)
        yield seen


def test_serve_starts_the_engine_and_serves_its_model(served, monkeypatch):
    monkeypatch.setenv(cli.API_KEY_ENV, "k1")
    code = cli.main(["serve", "--device", "cpu", "--max-model-len", "512",
                     "--served-model-name", "served-name", "--port", "0"])
    assert code == 0
    (launcher,) = FakeLauncher.started
    assert isinstance(launcher.config, EngineConfig) and launcher.config.max_model_len == 512
    assert launcher.options.served_model_name == "served-name" and launcher.stopped
    assert served["models_open"].status == 401  # the key came from the environment
    (model,) = served["models_keyed"].json()["data"]
    assert (model["id"], model["max_model_len"]) == ("served-name", 512)
    assert served["completion"].status == 200 and served["completion"].json()["model"] == "served-name"
    assert served["health"].status == 200


def test_the_flag_key_wins_and_the_model_name_defaults_to_the_model(served, monkeypatch):
    monkeypatch.setenv(cli.API_KEY_ENV, "other")
    assert cli.main(["serve", "--device", "cpu", "--api-key", "k1", "--port", "0"]) == 0
    assert served["models_keyed"].json()["data"][0]["id"] == "qwen3-tiny"
    assert served["completion"].status == 200


def test_a_startup_failure_is_one_line_and_exit_code_1(monkeypatch, capsys):
    @contextlib.contextmanager
    def failing(args, watch):
        raise RuntimeError("executor dp=0 tp=0 did not start: CUDA out of memory")
        yield

    monkeypatch.setattr(cli, "start_engine", failing)
    assert cli.main(["serve", "--device", "cpu", "--port", "0"]) == 1
    assert capsys.readouterr().err.strip() == (
        "cadence serve: RuntimeError: executor dp=0 tp=0 did not start: CUDA out of memory")


@contextlib.contextmanager
def _never_started(args, watch):
    raise AssertionError("the engine was started although the HTTP address is unusable")
    yield


@pytest.fixture
def listening_port():
    """A port another server listens on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


@pytest.mark.parametrize(("flags", "cause"), [
    (["--port", "80000"], "port 80000 is outside 0-65535"),
    (["--port", "-1"], "port -1 is outside 0-65535"),
    (["--host", "192.0.2.7", "--port", "0"], "no interface of this machine has that address"),
    (["--host", "no-such-host.invalid", "--port", "0"], "'no-such-host.invalid' is not a known address"),
])
def test_an_unusable_http_address_ends_serve_before_the_engine_starts(flags, cause, monkeypatch, capsys):
    monkeypatch.setattr(cli, "start_engine", _never_started)
    assert cli.main(["serve", "--device", "cpu", *flags]) == cli.EXIT_ADDRESS_UNAVAILABLE
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("cadence serve: cannot listen on ") and cause in line, line


def test_a_port_in_use_ends_serve_naming_it_before_the_engine_starts(listening_port, monkeypatch, capsys):
    monkeypatch.setattr(cli, "start_engine", _never_started)
    assert cli.main(["serve", "--device", "cpu", "--port", str(listening_port)]) == 3
    assert capsys.readouterr().err.strip() == (
        f"cadence serve: cannot listen on 127.0.0.1:{listening_port}: the port is already in use "
        "(another server listens there; choose another --port)")


def test_the_port_is_held_while_the_engine_loads_and_served_on(monkeypatch):
    """The socket bound before the engine started is the one uvicorn gets, so no one takes it meanwhile."""
    held = {}

    @contextlib.contextmanager
    def loading(args, watch):
        with socket.socket() as probe, pytest.raises(OSError):
            probe.bind(("127.0.0.1", args.port))
        held["checked"] = True
        yield ServedModel("m", 512, GenerationDefaults()), "ipc:///nowhere"

    port = free_port()
    served_on = {}
    monkeypatch.setattr(cli, "_run_http", lambda app, args, watch, http_socket: served_on.update(
        port=http_socket.getsockname()[1]))
    monkeypatch.setattr(cli, "start_engine", loading)
    assert cli.main(["serve", "--device", "cpu", "--port", str(port)]) == 0
    assert held == {"checked": True} and served_on == {"port": port}


@pytest.mark.parametrize(("given", "address"), [("5557", "tcp://127.0.0.1:5557"),
                                                ("0.0.0.0:5557", "tcp://0.0.0.0:5557")])
def test_native_tcp_takes_a_port_on_loopback_or_a_host_and_port(given, address):
    args = cli.build_parser().parse_args(["serve", "--native-tcp", given])
    assert args.native_tcp == address


@pytest.mark.parametrize("given", ["host", "host:0", "host:70000", ":x"])
def test_native_tcp_refuses_what_is_not_a_port(given, capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--native-tcp", given])
    assert "[HOST:]PORT" in capsys.readouterr().err
