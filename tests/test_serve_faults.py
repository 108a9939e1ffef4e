"""`cadence serve` when a process it cannot live without dies: the scheduler or the tokenizer is
killed (SIGKILL) while a stream runs. The stream ends with an error event naming the dead process,
/health answers 503 within seconds, the command exits 1 naming it, and nothing is left behind: no
process of the server, no file in /dev/shm."""

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

from benchmarks.processes import descendants
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


@pytest.mark.parametrize("victim", ["cadence:scheduler", "cadence:tokenizer"])
def test_a_dead_scheduler_or_tokenizer_fails_the_streams_turns_health_503_and_exits(victim):
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
        pid = next(p for p, cmdline in descendants(server.pid).items() if cmdline.startswith(victim))
        os.kill(pid, signal.SIGKILL)
        killed_s = time.monotonic()
        statuses = []
        while not statuses or statuses[-1] != 503:
            status, body = _get(port, "/health")
            statuses.append(status)
            assert time.monotonic() - killed_s < 3, f"/health said {statuses}"
        assert victim.split(":")[1] in body["reason"]
        streamer.join(10)
        assert not streamer.is_alive(), "the stream was left open"
        assert events[-1] == "[DONE]" and "error" in json.loads(events[-2])
        assert victim.split(":")[1] in json.loads(events[-2])["error"]["message"]
        _, stderr = server.communicate(timeout=30)
        assert server.returncode == 1
        assert f"stopped because {victim.split(':')[1]} exited with code -9" in stderr
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    time.sleep(0.5)
    assert descendants(server.pid) == {}
    assert [n for n in os.listdir(SHM_DIR) if n.startswith(f"cadence-{server.pid}-")] == []
