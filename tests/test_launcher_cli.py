"""`python -m procs.launcher`: starts the system, serves native clients, stops cleanly on SIGINT/SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from system_client import GREEDY, SystemClient

from ipc.shm_ring import SHM_DIR


def _cadence_pids(parent: int | None = None) -> set[int]:
    """Processes titled cadence:*, only the children of `parent` when given."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    titled = f.read().startswith(b"cadence:")
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if titled and (parent is None or ppid == parent):
                pids.add(int(entry))
    return pids


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_launcher_serves_then_stops_on_a_signal_leaving_no_process_and_no_segment(sig):
    shm_before = set(os.listdir(SHM_DIR))
    alone = not _cadence_pids()  # no other Cadence system on this machine to leave segments meanwhile
    proc = subprocess.Popen(
        [sys.executable, "-m", "procs.launcher", "--device", "cpu", "--dp", "2", "--max-model-len", "256",
         "--num-gpu-blocks-override", "64", "--max-num-batched-tokens", "128"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("native clients connect to ipc://"), line
        address = line.split()[-1]
        children = _cadence_pids(parent=proc.pid)
        assert len(children) == 4  # tokenizer, scheduler, two executors
        with SystemClient(address) as client:
            result = client.generate({"x": {"prompt": "hello"}}, GREEDY)["x"]
            assert len(result.token_ids) == GREEDY.max_tokens
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 5
    while _cadence_pids() & children:
        assert time.monotonic() < deadline, f"orphans left: {_cadence_pids() & children}"
        time.sleep(0.05)
    left = set(os.listdir(SHM_DIR)) - shm_before
    # Its ring segments are named after its run id, which starts with the launcher's pid; other
    # files (multiprocessing's semaphores) can be told apart only when no other system ran beside it.
    assert {name for name in left if name.startswith(f"cadence-{proc.pid}-")} == set()
    if alone and not _cadence_pids():
        assert left == set()
    assert not os.path.exists(address.removeprefix("ipc://"))
