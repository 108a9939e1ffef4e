"""`cadence serve` (also `python -m api serve`): start the engine's processes, serve the OpenAI API.
`cadence run-batch` runs a file of OpenAI Batch API requests through the same code (api/run_batch.py).

The engine's flags come from procs/args.py (`add_engine_args`, `config_from_args`); this module adds
the API's own: --host (default 127.0.0.1: not reachable from other machines unless asked),
--port (8000), --api-key (or the CADENCE_API_KEY environment variable), --served-model-name (the
name clients send as `model`; default the model's name), --strict-request-fields, and a few
limits. `start_engine` is where the server starts the launcher (api/offline.py starts it for
offline batches). The console script entry point is `api.cli:main`.

The HTTP address is bound before anything loads (api/listen_address.py): a port out of range or in
use, or a host this machine does not have, ends the command at once with one line naming the address
and the cause. Once the engine is ready the log names the native clients' address (an ipc socket in
the run's private directory, ipc/endpoints.py) as a `Client("...")` call to copy.

Exit codes: 0 stopped by SIGTERM, the engine shut down in order; 1 the engine failed to start or
stopped serving (its scheduler or tokenizer died); 2 a flag is wrong (argparse); 3 the HTTP address
cannot be listened on (`EXIT_ADDRESS_UNAVAILABLE`), found before the engine starts; 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from api.listen_address import AddressUnavailable, bind_http_socket, display_address
from api.protocol import ServedModel
from api.server import DEFAULT_MAX_BODY_BYTES, ApiConfig, build_app

API_KEY_ENV = "CADENCE_API_KEY"
EXIT_ADDRESS_UNAVAILABLE = 3  # the HTTP address cannot be listened on; nothing was started
_EXIT_AFTER_ENGINE_STOPPED_S = 3.0
log = logging.getLogger("cadence.api")


def add_api_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("API server")
    group.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: 127.0.0.1; 0.0.0.0 for every interface)")
    group.add_argument("--port", type=int, default=8000,
                       help="port to listen on (default: 8000; 0: any free port, logged at start)")
    group.add_argument("--api-key", default=None,
                       help=f"require 'Authorization: Bearer <key>' on /v1/ routes and the cache flush "
                            f"(default: ${API_KEY_ENV}, else no key)")
    group.add_argument("--served-model-name", default=None,
                       help="the model name clients send and see (default: the model's name)")
    group.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                       help=f"largest request body accepted (default: {DEFAULT_MAX_BODY_BYTES})")
    group.add_argument("--request-timeout", type=float, default=600.0,
                       help="seconds a request may go without output before it fails with 504 (default: 600)")
    group.add_argument("--native-tcp", type=native_tcp_address, default=None, metavar="[HOST:]PORT",
                       help="let native ZeroMQ clients of other machines connect on this tcp address too "
                            "(HOST default: 127.0.0.1); with an API key they must present it")
    group.add_argument("--strict-request-fields", action="store_true",
                       help="refuse (400) request fields this server does not know (default: ignore them "
                            "with one warning per field name, as vLLM does)")
    # Function calling is always on (api/tool_fields.py); vLLM's and SGLang's flags for it are accepted
    # so that their command lines run unchanged. Every name reads Qwen3's <tool_call> JSON blocks.
    group.add_argument("--enable-auto-tool-choice", action="store_true",
                       help="accepted for vLLM's command lines; tool_choice auto is always served")
    group.add_argument("--tool-call-parser", default="hermes", choices=("hermes", "qwen25", "qwen"),
                       help="how a reply's function calls are read: Qwen3's <tool_call> blocks, under "
                            "vLLM's name (hermes) or SGLang's (qwen25, qwen)")
    # Qwen3's reasoning is always split at <think> (api/reasoning.py); the reasoning-parser flags of
    # vLLM (`--reasoning-parser qwen3`, older `--enable-reasoning ... deepseek_r1`) and SGLang are
    # accepted for the same reason.
    group.add_argument("--reasoning-parser", default="qwen3", choices=("qwen3", "deepseek_r1"),
                       help="how a reply's reasoning is split off: Qwen3's <think> block, sent as "
                            "reasoning_content and reasoning (always on, Qwen3's way under either name)")
    group.add_argument("--enable-reasoning", action="store_true",
                       help="accepted for older vLLM command lines; the reasoning is always split off")
    # Flags that vLLM command lines for Qwen3 carry and that change nothing here: accepted, so those
    # command lines run unchanged.
    group.add_argument("--trust-remote-code", action="store_true",
                       help="accepted for vLLM's command lines: Qwen3 runs on Cadence's own model code, and "
                            "a checkpoint's code is never run")
    group.add_argument("--disable-log-requests", action="store_true",
                       help="accepted for vLLM's command lines: requests are not logged (see --access-log)")
    group.add_argument("--disable-log-stats", action="store_true",
                       help="accepted for vLLM's command lines: no statistics are logged (they are at "
                            "/metrics)")
    group.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    group.add_argument("--access-log", action="store_true", help="log every HTTP request (default: off)")


def native_tcp_address(value: str) -> str:
    """`--native-tcp`'s "[HOST:]PORT" as tcp://HOST:PORT, loopback when HOST is left out."""
    host, _, port = value.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{value!r} is not [HOST:]PORT with a port in 1-65535")
    return f"tcp://{host or '127.0.0.1'}:{port}"


def build_parser() -> argparse.ArgumentParser:
    from procs.args import add_engine_args

    parser = argparse.ArgumentParser(prog="cadence", description="Cadence: a serving engine for Qwen3.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="serve a model behind an OpenAI-compatible API",
        description="Start the engine's processes and serve the OpenAI API over them.")
    add_engine_args(serve)
    add_api_args(serve)
    batch = commands.add_parser(
        "run-batch", help="run a file of requests in OpenAI's Batch API format (as vLLM's run-batch)",
        description="Start the engine's processes, run every request of a JSONL file of OpenAI Batch API "
                    "lines through the API's code, and write one result line each (api/run_batch.py).")
    add_engine_args(batch)
    add_batch_args(batch)
    return parser


def add_batch_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("batch")
    group.add_argument("-i", "--input-file", required=True,
                       help="the requests, one JSON line each: custom_id, method, url, body ('-': stdin)")
    group.add_argument("-o", "--output-file", required=True,
                       help="where the results go, one JSON line each in the input's order ('-': stdout)")
    group.add_argument("--max-concurrency", type=_positive_int, default=1024,
                       help="requests in flight at most (default: 1024; the scheduler batches them)")
    group.add_argument("--served-model-name", default=None,
                       help="the model name the requests' bodies give (default: the model's name)")
    group.add_argument("--request-timeout", type=float, default=600.0,
                       help="seconds a request may go without output before it fails with 504 (default: 600)")
    group.add_argument("--strict-request-fields", action="store_true",
                       help="refuse (400) request fields this server does not know (default: ignore them)")
    group.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(native_tcp=None, api_key=None)


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer >= 1")
    return int(value)


def api_key_of(args: argparse.Namespace) -> str | None:
    return args.api_key or os.environ.get(API_KEY_ENV) or None


def api_config(args: argparse.Namespace, model: ServedModel, tokenizer_address: str) -> ApiConfig:
    key = api_key_of(args)
    return ApiConfig(
        model=model,
        tokenizer_address=tokenizer_address,
        api_key=key,
        # The front end wants the key of every client once it listens on tcp, the api process's too.
        tokenizer_api_key=key if args.native_tcp else None,
        max_body_bytes=args.max_request_bytes,
        timeout_s=args.request_timeout,
        strict_request_fields=args.strict_request_fields,
    )


class EngineWatch:
    """What `cadence serve` does when the engine dies under it (the launcher's on_fatal, called from
    its supervisor thread): every waiting request ends at once with a 503 naming the dead process,
    /health answers 503, and 3 s later the HTTP server stops, so the command exits 1 with that
    reason."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.app: Any = None
        self.http: Any = None  # the uvicorn.Server, once it runs

    def __call__(self, reason: str) -> None:
        self.reason = reason
        if self.app is not None:
            self.app.state.server.engine_stopped(reason)
        # A moment of 503s first: probes and load balancers see the server go, not a refused port.
        timer = threading.Timer(_EXIT_AFTER_ENGINE_STOPPED_S, self._stop_http)
        timer.daemon = True
        timer.start()

    def _stop_http(self) -> None:
        if self.http is not None:
            self.http.should_exit = True


@contextlib.contextmanager
def start_engine(args: argparse.Namespace, watch: EngineWatch) -> Iterator[tuple[ServedModel, str]]:
    """Start the engine's processes; yields the served model and the tokenizer's address."""
    from procs.args import config_from_args, launch_options_from_args
    from procs.launcher import Launcher

    engine_config = config_from_args(args)
    name = args.served_model_name or engine_config.model.name
    model = ServedModel(name, engine_config.max_model_len, engine_config.model.generation,
                        engine_config.scheduler.max_logprobs)
    options = replace(launch_options_from_args(args), native_tcp=args.native_tcp,
                      native_api_key=api_key_of(args) if args.native_tcp else None)
    with Launcher(engine_config, options, on_fatal=watch) as launcher:
        yield model, launcher.endpoints.tokenizer_frontend


def _run_http(app: Any, args: argparse.Namespace, watch: EngineWatch, http_socket: socket.socket) -> None:
    """Serve `app` on the socket bound before the engine started, until stopped."""
    import uvicorn

    # Open streams get their error event at once when the engine stops; the grace period bounds
    # what is left (a client that stopped reading).
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           access_log=args.access_log, timeout_graceful_shutdown=5))
    watch.http = server
    if watch.reason is None:  # the engine may have died while the app was being built
        server.run(sockets=[http_socket])


def configure_logging(args: argparse.Namespace) -> None:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s [cadence] %(message)s")
    # The engine's processes read their level from the environment they inherit (debug: a step trace).
    os.environ.setdefault("CADENCE_LOG_LEVEL", args.log_level.upper())


def serve(args: argparse.Namespace) -> int:
    configure_logging(args)
    try:  # before anything loads: a port in use must not cost minutes of loading first
        http_socket = bind_http_socket(args.host, args.port)
    except AddressUnavailable as exc:
        print(f"cadence {args.command}: {exc}", file=sys.stderr)
        return EXIT_ADDRESS_UNAVAILABLE
    address = display_address(args.host, http_socket.getsockname()[1])
    watch = EngineWatch()
    # uvicorn stops gracefully on SIGTERM, then raises it again once it has restored this handler:
    # this turns it into an exception, so the engine is shut down in order and its files removed.
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        with start_engine(args, watch) as (model, tokenizer_address):
            config = api_config(args, model, tokenizer_address)
            log.info("serving %s on http://%s (tokenizer at %s)%s", model.name, address, tokenizer_address,
                     ", API key required" if config.api_key else "")
            log.info('native clients (api.client) connect with Client("%s")', tokenizer_address)
            if args.native_tcp:
                access = " with the API key" if config.api_key else " (no API key: open to all who reach it)"
                log.info("native clients on other machines connect to %s%s", args.native_tcp, access)
            watch.app = build_app(config)
            _run_http(watch.app, args, watch, http_socket)
    finally:
        signal.signal(signal.SIGTERM, previous)
        http_socket.close()
    if watch.reason is not None:
        print(f"cadence {args.command}: stopped because {watch.reason}", file=sys.stderr)
        return 1
    return 0


class Terminated(Exception):  # noqa: N818 - a signal, not an error
    """SIGTERM: stop serving and shut the engine down in order."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run-batch":
            from api.run_batch import run_batch

            configure_logging(args)
            return run_batch(args)
        return serve(args)
    except KeyboardInterrupt:
        return 130
    except Terminated:
        return 0
    except Exception as exc:  # a startup failure: say what, not a traceback
        if args.log_level == "debug":
            raise
        print(f"cadence {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
