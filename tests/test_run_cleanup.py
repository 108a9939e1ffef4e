"""Nothing of a run is left once it ends, however it ends: its socket directory (ipc/endpoints.py) and
its /dev/shm segments are gone after a stop with a SIGKILLed executor, after a failed start, and
after its launcher is killed with SIGKILL (its tokenizer removes them on the way out; its executors,
spawned or forked from the forkserver, end with it); what a run killed whole left behind is removed
by the next launcher's start, and a run whose launcher still holds its lock (ipc/run_lock.py) is
not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from system_client import tiny_config

from benchmarks.lib.processes import remember, survivors
from ipc.endpoints import Endpoints
from ipc.run_lock import RunLock, remove_ended_runs
from ipc.shm_ring import SHM_DIR, ring_name
from procs import executor_start
from procs.fault_injection import ENV
from procs.launcher import Launcher, LaunchError, LaunchOptions


@pytest.fixture
def root():
    """A short runtime root: a Unix socket's path must fit in 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="cr-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _segments(run_id: str) -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if n.startswith(f"cadence-{run_id}-")]


def _wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_run_stopped_after_an_executor_was_killed_leaves_nothing(root):
    launcher = Launcher(tiny_config(dp=2), LaunchOptions(startup_timeout_s=180, runtime_root=str(root)))
    with launcher:
        run_dir = root / launcher.run_id
        assert sorted(p.name for p in run_dir.iterdir())[:2] == ["doorbell.0.sock", "doorbell.1.sock"]
        rings = [ring_name(launcher.run_id, replica) for replica in (0, 1)]
        assert sorted(_segments(launcher.run_id)) == rings
        launcher.kill_executor(1, 0)
        _wait_until(lambda: not launcher.replicas[1].alive, 10, "the launcher never saw the executor die")
    assert list(root.iterdir()) == [] and _segments(launcher.run_id) == []


def test_a_failed_start_leaves_nothing(root, monkeypatch):
    monkeypatch.setenv(ENV, "dp=0 tp=0 at=join do=raise")
    launcher = Launcher(tiny_config(), LaunchOptions(startup_timeout_s=180, runtime_root=str(root)))
    with pytest.raises(LaunchError, match="executor dp=0 tp=0 on cpu failed to start"):
        launcher.start()
    assert list(root.iterdir()) == [] and _segments(launcher.run_id) == []


@pytest.mark.parametrize("start", executor_start.START_METHODS)
def test_a_launcher_killed_with_sigkill_leaves_nothing(root, start):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(root), **{executor_start.ENV: start})
    command = [sys.executable, "-m", "procs.launcher", "--device", "cpu", "--max-model-len", "256",
               "--num-gpu-blocks-override", "64"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"native clients connect to ipc://{root}/cadence/{proc.pid}-"), line
        children = remember(proc.pid)
        assert _segments(f"{proc.pid}")
    finally:
        proc.kill()
        proc.wait()
    assert survivors(children, wait_s=15) == []
    _wait_until(lambda: list((root / "cadence").iterdir()) == [], 5,
                f"left behind: {list((root / 'cadence').iterdir())}")
    assert _segments(f"{proc.pid}") == []


def test_a_start_removes_what_runs_killed_whole_left_and_keeps_live_runs(root):
    ended, live, unlocked = "4242-a1b2c3", "4243-d4e5f6", "4244-0a0b0c"
    for run in (ended, live, unlocked):
        (root / run).mkdir(mode=0o700)
        (root / run / "results.sock").touch()
    RunLock.hold(root / ended).release()  # its launcher died: the kernel let go of the lock
    holder = RunLock.hold(root / live)  # a launcher, perhaps in a pid namespace of its own, still runs
    ended_ring = Path(SHM_DIR) / ring_name(ended, 0)
    ended_ring.touch()
    try:
        with Launcher(tiny_config(), LaunchOptions(startup_timeout_s=180, runtime_root=str(root))):
            assert not (root / ended).exists() and not ended_ring.exists()
            assert (root / live / "results.sock").exists()
            assert (root / unlocked).exists()  # no lock: a directory being made, or not a run
        assert remove_ended_runs(root) == []  # a live run is never taken
    finally:
        holder.release()
        ended_ring.unlink(missing_ok=True)
    assert sorted(p.name for p in root.iterdir()) == [live, unlocked]
    assert remove_ended_runs(root) == [live]


def test_a_run_directory_in_use_is_not_taken_twice(root):
    first = Endpoints.create("4245-aaaaaa", runtime_root=root)
    with pytest.raises(RuntimeError, match="belongs to a run that is still on"):
        Endpoints.create("4245-aaaaaa", runtime_root=root)
    first.cleanup()
    assert list(root.iterdir()) == []
    Endpoints.create("4245-aaaaaa", runtime_root=root).cleanup()  # over: the name is free again
