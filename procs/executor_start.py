"""How the launcher starts executor processes: spawned (the default), or forked from a forkserver.

A spawned executor is a fresh interpreter: it imports torch and the model code itself, ~2.5 of the
~4 CPU-seconds an executor takes to start on the CPU. A process that launches many servers one
after another (the test suite, the generalization matrix) can set

    CADENCE_EXECUTOR_START=forkserver

and its executors are forked from one server process that imported torch and the executor's
modules once, at its first launch (vLLM's VLLM_WORKER_MULTIPROC_METHOD is the same knob). Each
executor still runs in a process of its own, with the launcher's environment as it is at that
launch: what the preloaded modules read at import (TRITON_INTERPRET, for one) is read once, when
the forkserver starts. The executor's parent is then the forkserver, which exits when the launcher's
process does, so an executor still outlives no launcher (procs/child.py); the launcher supervises
it through its sentinel as it does a spawned one.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from multiprocessing.context import BaseContext

ENV = "CADENCE_EXECUTOR_START"
START_METHODS = ("spawn", "forkserver")
# What the forkserver imports once: torch and everything an executor imports to build its runner.
PRELOAD = ["procs.executor_proc", "core.execution.runner"]


def start_method() -> str:
    """$CADENCE_EXECUTOR_START, spawn when unset; ValueError naming the variable otherwise."""
    method = os.environ.get(ENV) or "spawn"
    if method not in START_METHODS:
        raise ValueError(f"{ENV}={method!r}: executors start by {' or '.join(START_METHODS)}")
    return method


def executor_context() -> BaseContext:
    return forkserver_context() if start_method() == "forkserver" else mp.get_context("spawn")


def forkserver_context() -> BaseContext:
    """The forkserver's context, its server (one a process, started at its first use) preloading
    what an executor imports; tests start their own torch workers from it too."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def process_args(context: BaseContext, target: Callable[..., None],
                 args: tuple) -> tuple[Callable[..., None], tuple]:
    """(target, args) for an executor's Process in `context`: from the forkserver, the child first
    takes the launcher's environment of now (the forkserver's own is that of its start)."""
    if context.get_start_method() == "forkserver":
        return _in_environment, (dict(os.environ), target, *args)
    return target, args


def _in_environment(environment: dict[str, str], target: Callable[..., None], *args: object) -> None:
    try:
        import setproctitle
    except ImportError:
        pass
    else:  # it finds the command line's memory through the environment's strings: before they move
        setproctitle.getproctitle()
    os.environ.clear()
    os.environ.update(environment)
    target(*args)
