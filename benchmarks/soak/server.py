"""The soaked server: `python -m api serve` as a subprocess (start, wait for /health, stop in order
and report what outlived it), the RSS of each of its processes, and its pages once idle (through
the native client on the tokenizer's address)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

from api.client import Client
from benchmarks.lib.processes import cmdline, descendants, remember, rss_mib, survivors
from benchmarks.soak.workload import MAX_MODEL_LEN
from ipc.shm_ring import SHM_DIR, run_prefix

_SIGINT_GRACE_S = 20.0



def process_name(pid: int, root: int) -> str:
    """The engine's children set titles (`cadence:scheduler`); the rest are named by their command."""
    line = cmdline(pid)
    if pid == root:
        return "api server"
    if line.startswith("cadence:"):
        return line
    if "resource_tracker" in line:
        return "multiprocessing resource_tracker"
    return line[:60] or f"pid {pid}"


def rss_snapshot(root: int) -> dict[str, dict[str, Any]]:
    """name -> {pid, rss_mib} for the server process and every descendant."""
    snapshot = {}
    for pid in [root, *descendants(root)]:
        rss = rss_mib(pid)
        if rss is not None:
            name = process_name(pid, root)
            key = name if name not in snapshot else f"{name} ({pid})"
            snapshot[key] = {"pid": pid, "rss_mib": round(rss, 1)}
    return snapshot


class ServerUnderTest:
    """`python -m api serve` as a subprocess: start, wait for /health, stop, and what it left."""

    def __init__(self, model: str, extra: list[str], log_path: str, startup_timeout_s: float,
                 device: str = "cpu") -> None:
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "api", "serve", "--model", model, "--device", device, "--port",
                        str(self.port), "--max-model-len", str(MAX_MODEL_LEN), *extra]
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None
        self.tokenizer_address: str | None = None
        self.startup_s = 0.0
        self._seen: dict[int, int] = {}  # descendant pid -> start time in ticks
        self._names: dict[int, str] = {}

    def start(self) -> None:
        start = time.monotonic()
        with open(self.log_path, "wb") as log:
            # Its own session: a Ctrl-C at the soak's terminal reaches the soak, which stops it in order.
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        while not _healthy(self.base_url):
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode} during startup; "
                                   f"{self.log_path} ends:\n{self.log_tail()}")
            if time.monotonic() - start > self.startup_timeout_s:
                raise RuntimeError(f"the server was not healthy within {self.startup_timeout_s:.0f} s; "
                                   f"{self.log_path} ends:\n{self.log_tail()}")
            time.sleep(0.5)
        self.startup_s = time.monotonic() - start
        with open(self.log_path, errors="replace") as f:
            match = re.search(r"tokenizer at (ipc://[^\s)]+)", f.read())
        self.tokenizer_address = match[1] if match else None
        self.remember_children()

    def remember_children(self) -> None:
        assert self.process is not None
        for pid, ticks in remember(self.process.pid).items():
            if pid != self.process.pid and pid not in self._seen:
                self._seen[pid] = ticks
                self._names[pid] = process_name(pid, self.process.pid)

    def stop(self) -> dict[str, Any]:
        """SIGINT, SIGTERM after 20 s, SIGKILL after 20 more; then what survived it."""
        assert self.process is not None
        self.remember_children()
        start = time.monotonic()
        signals = []
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            signals.append(sig.name)
            self.process.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(_SIGINT_GRACE_S)
                break
        stop_s = time.monotonic() - start
        left = survivors(self._seen, wait_s=5.0)
        for pid in left:  # ours to clean up, by pid; the report names them
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        prefix = run_prefix(str(self.process.pid))  # run ids are <launcher pid>-<hex>
        segments = sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
        return {"signals": signals, "exit_code": self.process.returncode, "stop_s": round(stop_s, 2),
                "surviving_processes": [f"{self._names[p]} (pid {p})" for p in left],
                "shm_segments_left": segments,
                "clean": signals == ["SIGINT"] and not left and not segments}

    def kill(self) -> None:
        """The soak itself failed: make sure the server does not outlive it."""
        if self.process is not None and self.process.poll() is None:
            self.stop()

    def log_tail(self, lines: int = 30) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def launcher_pid(tokenizer_address: str) -> int | None:
    """The server's pid, from the run id in its endpoint paths (`<launcher pid>-<hex>`)."""
    match = re.search(r"/(\d+)-[0-9a-f]+/", tokenizer_address)
    return int(match[1]) if match else None


def idle_pages(address: str, wait_s: float) -> dict[str, Any]:
    """Per replica, once the engine is idle (or after `wait_s`): pages, the router's load, queues."""
    deadline = time.monotonic() + wait_s
    with Client(address, timeout_s=10.0, name="soak") as client:
        while True:
            info = client.server_info()
            replicas = [_replica_pages(r) for r in info.replicas]
            idle = all(r["idle"] for r in replicas)
            if idle or time.monotonic() > deadline:
                return {"serving": info.serving, "idle": idle, "replicas": replicas}
            time.sleep(0.5)


def _replica_pages(replica: Any) -> dict[str, Any]:
    stats = replica.stats
    row: dict[str, Any] = {"replica": replica.replica, "alive": replica.alive, "reason": replica.reason,
                           "num_pages": replica.num_pages, "routed_load_tokens": replica.routed_load_tokens}
    if stats is None:
        return {**row, "idle": False}
    held = replica.num_pages - stats.num_free_pages - stats.num_cached_pages
    row.update(free=stats.num_free_pages, cached=stats.num_cached_pages, held_beyond_cache=held,
               num_running=stats.num_running, num_waiting=stats.num_waiting,
               prefix_cache_hit_rate=round(stats.prefix_cache_hit_rate, 4),
               num_preemptions=stats.num_preemptions)
    busy = stats.num_running + stats.num_waiting
    row["idle"] = held == 0 and replica.routed_load_tokens == 0 and busy == 0
    return row
