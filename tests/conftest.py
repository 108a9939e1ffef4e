import os
from pathlib import Path

import background_children
import pytest
import torch
import triton_interpreter

from procs import executor_start

# Two cores run the whole suite; more threads only thrash. A background child, one of two running
# at once, gets one (tests/background_children.py).
torch.set_num_threads(int(os.environ.get(background_children.TORCH_THREADS_ENV, "2")))
# The suite starts ~100 servers: their executors fork from one process that imported torch once
# (procs/executor_start.py), not each from a fresh interpreter.
os.environ.setdefault(executor_start.ENV, "forkserver")
# A CPU executor's OpenMP threads sleep between steps instead of spinning on cores that its
# scheduler, tokenizer and client need too (read when torch loads in each process started from now).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.hookimpl(trylast=True)  # after -k and -m deselected theirs: only the selected children start
def pytest_collection_modifyitems(session, config, items):
    """The background children start now, at the lowest CPU priority, and their tests run last,
    when most of them are done (tests/background_children.py)."""
    children = [item for item in items if item.name in background_children.CHILD_TESTS]
    if not config.option.collectonly:
        background_children.start_children({Path(item.path).resolve(): _child_env(item) for item in children
                                            if not _runs_here(item)})
    items[:] = [item for item in items if item.name not in background_children.CHILD_TESTS] + children


def _runs_here(item) -> bool:
    """A module whose kernels this process interprets, or this process being the child, runs the
    module's tests itself (its child test skips)."""
    if item.name == triton_interpreter.CHILD_TEST:
        return item.module.INTERPRETED
    return background_children.in_child()


def _child_env(item) -> dict[str, str]:
    return triton_interpreter.CHILD_ENV if item.name == triton_interpreter.CHILD_TEST else {}


def pytest_sessionfinish(session, exitstatus):
    background_children.stop_children()
