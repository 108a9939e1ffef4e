import os
from pathlib import Path

import pytest
import torch
import triton_interpreter

# Two cores run the whole suite; more threads only thrash. A Triton interpreter child, one of two
# running at once, gets one (tests/triton_interpreter.py).
torch.set_num_threads(int(os.environ.get(triton_interpreter.TORCH_THREADS_ENV, "2")))


@pytest.hookimpl(trylast=True)  # after -k and -m deselected theirs: only the selected children start
def pytest_collection_modifyitems(session, config, items):
    """The Triton interpreter's children start now, in the background at the lowest CPU priority,
    and their tests run last, when most of them are done (tests/triton_interpreter.py)."""
    children = [item for item in items if item.name == triton_interpreter.CHILD_TEST]
    if not config.option.collectonly:
        # A module whose kernels this process interprets runs them itself (its CHILD_TEST skips).
        triton_interpreter.start_children([Path(item.path).resolve() for item in children
                                           if not item.module.INTERPRETED])
    items[:] = [item for item in items if item.name != triton_interpreter.CHILD_TEST] + children


def pytest_sessionfinish(session, exitstatus):
    triton_interpreter.stop_children()
