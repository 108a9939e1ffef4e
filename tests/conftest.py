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
    """The Triton interpreter's children first, so that they run two at a time with nothing else
    competing for the cores (tests/triton_interpreter.py)."""
    children = [item for item in items if item.name == triton_interpreter.CHILD_TEST]
    triton_interpreter.session_child_files[:] = [Path(item.path).resolve() for item in children]
    items[:] = children + [item for item in items if item.name != triton_interpreter.CHILD_TEST]
