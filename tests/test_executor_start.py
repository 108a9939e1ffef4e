"""How executors start (procs/executor_start.py): spawned, every child is the launcher's own and
serves; forked from the forkserver, an executor takes the launcher's environment of its own launch,
not the one the forkserver started with; a start method that does not exist is refused before any
process starts, naming the variable. (The rest of the suite runs its in-process servers on the
forkserver: tests/conftest.py.)"""

from __future__ import annotations

import os

import pytest
from system_client import GREEDY, SystemClient, tiny_config

from procs import executor_start, fault_injection
from procs.launcher import Launcher, LaunchError, LaunchOptions


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _serves(launcher: Launcher) -> None:
    with SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        result = client.generate({"x": {"prompt": "hello"}}, GREEDY)["x"]
    assert result.error is None and len(result.token_ids) == GREEDY.max_tokens


def test_spawned_executors_are_the_launchers_own_children_and_serve(monkeypatch):
    monkeypatch.setenv(executor_start.ENV, "spawn")
    with Launcher(tiny_config(dp=2), LaunchOptions(startup_timeout_s=180)) as launcher:
        assert {_parent(c.process.pid) for c in launcher.children} == {os.getpid()}
        _serves(launcher)


def test_a_forkserver_executor_takes_the_environment_of_its_own_launch(monkeypatch):
    monkeypatch.setenv(executor_start.ENV, "forkserver")
    with Launcher(tiny_config(), LaunchOptions(startup_timeout_s=180)) as launcher:
        (executor,) = launcher.executors
        assert _parent(executor.process.pid) != os.getpid()  # the forkserver's, which runs from now on
        assert _parent(launcher.scheduler.process.pid) == os.getpid()  # the others are still spawned
        _serves(launcher)
    # The forkserver started without this variable; the next executor must see it all the same.
    monkeypatch.setenv(fault_injection.ENV, "dp=0 tp=0 at=join do=raise")
    with pytest.raises(LaunchError, match="executor dp=0 tp=0 on cpu failed to start: InjectedStepError"):
        Launcher(tiny_config(), LaunchOptions(startup_timeout_s=180)).start()


def test_an_unknown_start_method_is_refused_before_any_process_starts(monkeypatch):
    monkeypatch.setenv(executor_start.ENV, "fork")
    launcher = Launcher(tiny_config())
    with pytest.raises(LaunchError, match=r"CADENCE_EXECUTOR_START='fork': executors start by spawn or "
                                          r"forkserver"):
        launcher.start()
    assert launcher.children == [] and launcher.endpoints is None
