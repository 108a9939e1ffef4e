"""`python -m procs.launcher`: starts the system, serves native clients, stops cleanly on SIGINT/SIGTERM;
a layout that needs more GPUs than are visible is refused before any process starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from system_client import GREEDY, SystemClient, tiny_config

from ipc.shm_ring import SHM_DIR
from procs import devices, executor_start
from procs.devices import GPUCountError, assign_devices
from procs.launcher import Launcher, LaunchError, LaunchOptions


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
    spawned = {k: v for k, v in os.environ.items() if k != executor_start.ENV}  # every child the launcher's
    proc = subprocess.Popen(
        [sys.executable, "-m", "procs.launcher", "--device", "cpu", "--dp", "2", "--max-model-len", "256",
         "--num-gpu-blocks-override", "64", "--max-num-batched-tokens", "128"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=spawned)
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
    # This run's segments only: other servers on the machine may hold theirs.
    assert [n for n in os.listdir(SHM_DIR) if n.startswith(f"cadence-{proc.pid}-")] == []
    assert not os.path.exists(address.removeprefix("ipc://"))


def test_more_gpus_than_visible_are_refused_before_any_process_starts(monkeypatch):
    monkeypatch.setattr(devices, "visible_gpu_count", lambda: 2)
    launcher = Launcher(replace(tiny_config(dp=2, tp=2), device="cuda"))
    started = time.monotonic()
    with pytest.raises(LaunchError, match=r"--dp 2 --tp 2 needs 4 GPUs, one per rank, but 2 are visible "
                                          r".*executor dp=1 tp=0 would need cuda:2"):
        launcher.start()
    assert time.monotonic() - started < 1.0
    assert launcher.children == [] and launcher.endpoints is None


def test_each_rank_gets_a_card_of_its_own_or_all_share_a_single_card():
    dp2_tp2 = replace(tiny_config(dp=2, tp=2), device="cuda")
    assert assign_devices(dp2_tp2, num_visible=8) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert assign_devices(dp2_tp2, num_visible=1) == ["cuda:0"] * 4  # the one-card layout
    assert assign_devices(replace(dp2_tp2, device="cuda:1"), num_visible=8) == ["cuda:1"] * 4
    assert assign_devices(tiny_config(dp=2, tp=2), num_visible=0) == ["cpu"] * 4
    with pytest.raises(GPUCountError, match=r"needs 4 GPUs, .* 3 are visible .*dp=1 tp=1 would need cuda:3"):
        assign_devices(dp2_tp2, num_visible=3)
    with pytest.raises(GPUCountError, match="no CUDA device is visible"):
        assign_devices(dp2_tp2, num_visible=0)


def test_a_dist_timeout_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match=r"--dist-timeout must be positive \(seconds\), not 0"):
        LaunchOptions(dist_timeout_s=0)
