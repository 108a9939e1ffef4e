"""`cadence serve` when one of its processes dies (SIGKILL) while a stream runs. The stream ends
with an error event naming the dead process and /health answers 503 within seconds. Without the
scheduler or the tokenizer the command exits 1 naming it; with its only executor dead it keeps
answering (503) until stopped. A TP rank that never reaches its peers ends the start-up after
--dist-timeout, naming it. Nothing is left behind: no process of the server, no file in /dev/shm."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from benchmarks.lib.processes import cmdline, find_by_title, remember, survivors
from ipc.shm_ring import SHM_DIR


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def _stream(port: int, events: list[str]) -> None:
    """A long streamed completion; every SSE data line goes into `events`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {"model": "qwen3-tiny", "prompt": "Once upon a time", "max_tokens": 900, "stream": True,
            "ignore_eos": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    for line in response:
        if line.startswith(b"data: "):
            events.append(line[6:].decode().strip())


@pytest.mark.parametrize("victim", ["cadence:scheduler", "cadence:tokenizer", "cadence:executor dp=0 tp=0"])
def test_a_dead_process_fails_the_streams_and_turns_health_503(victim):
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "api", "serve", "--device", "cpu", "--port", str(port),
                               "--max-model-len", "1024"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, server.communicate()[1]
            try:
                if _get(port, "/health")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.5)
        events: list[str] = []
        streamer = threading.Thread(target=_stream, args=(port, events), daemon=True)
        streamer.start()
        while len(events) < 3:
            assert time.monotonic() < deadline + 60, "the stream never started"
            time.sleep(0.05)
        processes = remember(server.pid)
        os.kill(find_by_title(server.pid, victim), signal.SIGKILL)
        killed_s = time.monotonic()
        statuses = []
        while not statuses or statuses[-1] != 503:
            status, body = _get(port, "/health")
            statuses.append(status)
            assert time.monotonic() - killed_s < 3, f"/health said {statuses}"
        name = victim.split(":")[1]
        assert name in body["reason"]
        streamer.join(10)
        assert not streamer.is_alive(), "the stream was left open"
        assert events[-1] == "[DONE]" and "error" in json.loads(events[-2])
        assert name in json.loads(events[-2])["error"]["message"]
        if name.startswith("executor"):  # the server stays up to say it cannot serve
            time.sleep(4)
            assert server.poll() is None and _get(port, "/health")[0] == 503
            server.send_signal(signal.SIGTERM)  # what a supervisor sends
            server.communicate(timeout=60)
            assert server.returncode == 0
        else:
            _, stderr = server.communicate(timeout=30)
            assert server.returncode == 1
            assert f"stopped because {name} exited with code -9" in stderr
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert survivors(processes, wait_s=5) == []
    assert [n for n in os.listdir(SHM_DIR) if n.startswith(f"cadence-{server.pid}-")] == []


def test_a_tp_rank_that_never_joins_ends_cadence_serve_naming_it_after_the_dist_timeout(tmp_path):
    env = dict(os.environ, CADENCE_INJECT_FAULT="dp=0 tp=1 at=join do=hang")
    command = [sys.executable, "-m", "api", "serve", "--device", "cpu", "--port", str(_free_port()),
               "--tp", "2", "--dist-timeout", "5", "--max-model-len", "256"]
    started = time.monotonic()
    with open(tmp_path / "serve.log", "w+") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            processes: dict[int, int] = {}
            while server.poll() is None and len(processes) < 3:  # both executors and the tokenizer
                processes = {pid: since for pid, since in remember(server.pid).items()
                             if cmdline(pid).startswith("cadence:")}
                time.sleep(0.05)
            server.wait(timeout=120)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        log.seek(0)
        output = log.read()
    # Well within the 900 s start-up timeout: the spawn, torch's import, then 5 s of waiting.
    assert time.monotonic() - started < 60, output
    assert server.returncode == 1, output
    assert ("executor dp=0 tp=0 on cpu failed to start: TPStartupError: tp=0 on cpu: tp=1 of 2 ranks did "
            "not join the TP group within 5 s (--dist-timeout) (still starting: executor dp=0 tp=1 on cpu)"
            ) in output
    assert len(processes) == 3 and survivors(processes, wait_s=5) == []
    assert [n for n in os.listdir(SHM_DIR) if n.startswith(f"cadence-{server.pid}-")] == []
