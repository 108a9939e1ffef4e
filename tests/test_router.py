"""Two `cadence serve` behind the SGLang Model Gateway (`pip install -e .[router]`), on loopback: the
deployment docs/deploy.md describes, with its commands. Skipped when sglang_router is not installed.

The gateway adds fields of its own to every body (`no_stop_trim`, `continue_final_message`, ...),
asks each worker for /health and /get_model_info, sends completions' prompts as text only, and
gathers the workers' Prometheus text at /engine_metrics. The servers are the tiny preset on the
CPU, one with one replica and one with two (--dp 2); the workload is a few requests, so the test
stays quick on two cores.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from free_ports import free_port

from ipc.endpoints import default_runtime_root
from ipc.shm_ring import SHM_DIR

pytest.importorskip("sglang_router")

STARTUP_S = 240
MODEL = "qwen3-tiny"


def _request(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, json.dumps(body) if body is not None else None,
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _wait_until(ready, what: str, processes: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + STARTUP_S
    while True:
        for p in processes:
            assert p.poll() is None, f"{p.args} exited with {p.returncode}"
        try:
            if ready():
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{what} did not come up within {STARTUP_S} s"
        time.sleep(0.5)


def _serve(port: int, *layout: str) -> subprocess.Popen:
    # Its own session, so that the test can kill the whole server (api, tokenizer, scheduler, executors).
    return subprocess.Popen([sys.executable, "-m", "api", "serve", "--device", "cpu", "--port", str(port),
                             "--max-model-len", "1024", *layout], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _router(port: int, workers: list[int], policy: str) -> subprocess.Popen:
    # docs/deploy.md's command: a worker that fails one health check (every 2 s) leaves the rotation.
    return subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                             "--port", str(port), "--prometheus-port", str(free_port()), "--policy", policy,
                             "--health-check-interval-secs", "2", "--health-failure-threshold", "1",
                             "--worker-urls", *(f"http://127.0.0.1:{w}" for w in workers)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(process: subprocess.Popen, group: bool) -> None:
    if process.poll() is None:
        if group:
            os.killpg(process.pid, signal.SIGTERM)
        else:
            process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def fleet():
    """Two servers (one replica; two replicas) and a router for each policy in front of both."""
    workers = [free_port(), free_port()]
    servers = [_serve(workers[0]), _serve(workers[1], "--dp", "2")]
    routers: dict[str, int] = {}
    router_processes = []
    try:
        for port in workers:
            _wait_until(lambda port=port: _request(port, "GET", "/health")[0] == 200, f"server :{port}",
                        servers)
        for policy in ("cache_aware", "round_robin"):
            routers[policy] = free_port()
            router_processes.append(_router(routers[policy], workers, policy))
        for policy, port in routers.items():
            _wait_until(lambda port=port: MODEL in _request(port, "GET", "/v1/models")[1].decode(),
                        f"router {policy}", router_processes)
        yield {"workers": workers, "servers": servers, "routers": routers}
    finally:
        for process in router_processes:
            _stop(process, group=False)
        for process in servers:
            _stop(process, group=True)
            _remove_leftovers(process.pid)


def _remove_leftovers(pid: int) -> None:
    """What a SIGKILLed server could not remove: its runtime directory of sockets, its rings."""
    root = default_runtime_root()
    for name in os.listdir(root) if root.is_dir() else []:
        if name.startswith(f"{pid}-"):
            shutil.rmtree(root / name, ignore_errors=True)
    for name in os.listdir(SHM_DIR):
        if name.startswith(f"cadence-{pid}-"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(SHM_DIR, name))


def test_the_router_lists_the_served_model_not_unknown(fleet):
    status, body = _request(fleet["routers"]["cache_aware"], "GET", "/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(body)["data"]] == [MODEL]


def test_completions_and_chats_pass_through_the_router_with_its_extra_fields(fleet):
    port = fleet["routers"]["cache_aware"]
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3, "ignore_eos": True}
    status, body = _request(port, "POST", "/v1/completions", body)
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] == 3
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, body = _request(port, "POST", "/v1/chat/completions", body)
    assert status == 200, body
    assert json.loads(body)["choices"][0]["finish_reason"] in ("length", "stop")


def _load(base_port: int, seed: int) -> dict:
    """The guide's load command on a small shared-prefix workload; returns its JSON result."""
    out = f"/tmp/cadence-router-load-{os.getpid()}-{seed}.json"
    command = [sys.executable, "-m", "benchmarks.load", "--base-url", f"http://127.0.0.1:{base_port}",
               "--text-prompts", "--dataset", "shared-prefix", "--groups", "4", "--prompts-per-group", "6",
               "--system-len", "192", "--question-len", "8", "--output-len", "2", "--max-concurrency", "8",
               "--seed", str(seed), "--no-progress", "--out", out]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    try:
        with open(out) as f:
            return json.load(f)
    finally:
        os.remove(out)


def test_shared_prefix_load_through_the_router_completes_and_hits_the_cache(fleet):
    # A new seed per run: new system prompts, so that one run's cache does not serve the next.
    cache_aware = _load(fleet["routers"]["cache_aware"], seed=11)
    round_robin = _load(fleet["routers"]["round_robin"], seed=12)
    for result in (cache_aware, round_robin):
        assert (result["completed"], result["failed"]) == (24, 0), result["errors"]
    hit_rate = cache_aware["prefix_cache_hit_rate"]
    assert None not in (hit_rate, round_robin["prefix_cache_hit_rate"]), "the router's metrics were not read"
    print(f"prefix hit rate: cache_aware {hit_rate:.1%}, "
          f"round_robin {round_robin['prefix_cache_hit_rate']:.1%}")
    # Every group's first request misses; cache-aware routing keeps the others on its server.
    assert hit_rate > 0.5 * cache_aware["ideal_prefix_cache_hit_rate"]


def _healthy_workers(port: int) -> int:
    status, body = _request(port, "GET", "/readiness")
    return json.loads(body)["healthy_workers"]


def test_a_dead_server_behind_the_router_hangs_nothing_and_leaves_the_rotation(fleet):
    """Last: it SIGKILLs the second server. Until the router's health check notices, a request
    may meet the dead worker: it ends at once, served by a retry or with an error naming the
    worker; none hangs. Once noticed, every request goes to the survivor."""
    server = fleet["servers"][1]
    os.killpg(server.pid, signal.SIGKILL)
    server.wait(30)
    port = fleet["routers"]["cache_aware"]
    deadline = time.monotonic() + 30
    i = 0
    while _healthy_workers(port) != 1:
        started = time.monotonic()
        status, body = _request(port, "POST", "/v1/completions",
                                {"model": MODEL, "prompt": f"request {i} during the loss", "max_tokens": 2})
        assert status == 200 or (status >= 500 and b"error" in body), body
        assert time.monotonic() - started < 30
        assert time.monotonic() < deadline, "the router kept the dead worker for 30 s"
        i += 1
    for i in range(6):
        status, body = _request(port, "POST", "/v1/completions",
                                {"model": MODEL, "prompt": f"request {i} after the loss", "max_tokens": 2})
        assert status == 200, body
