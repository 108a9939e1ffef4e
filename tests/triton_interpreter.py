"""Triton kernels tested on the CPU under TRITON_INTERPRET=1.

Triton reads TRITON_INTERPRET when it is first imported, so a test module sets it before importing
triton. When another module of the same pytest run imported triton first, the kernels were built
for a GPU: then the module's tests skip here and its `test_kernels_in_a_fresh_interpreter` runs the
whole module again in a child process, where they are interpreted.

The children are pure computation on one core each, so a run's children go two at a time: the
session's CHILD_TESTs run first (tests/conftest.py orders them), and the first one that needs a child
starts them all, every module's in a pool of two, while the test process only waits for them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

CHILD_TEST = "test_kernels_in_a_fresh_interpreter"
CONCURRENT_CHILDREN = 2
# A child's torch threads (tests/conftest.py): one, with CONCURRENT_CHILDREN sharing two cores.
TORCH_THREADS_ENV = "CADENCE_TEST_TORCH_THREADS"
CHILD_TIMEOUT_S = 600
REPO = Path(__file__).resolve().parent.parent

# The test files whose CHILD_TEST this session runs (tests/conftest.py sets it after collection).
session_child_files: list[Path] = []
_children: dict[Path, Future] = {}


def is_interpreted(*kernels: object) -> bool:
    """Whether every one of `kernels` (triton's own, such as tl.zeros, and the module's) was built
    by the interpreter."""
    return all(type(fn).__name__ == "InterpretedFunction" for fn in kernels)


def skip_unless_interpreted(request: pytest.FixtureRequest, interpreted: bool) -> None:
    """For an autouse fixture: skip a kernel test that cannot run in this process."""
    if not interpreted and request.node.originalname != CHILD_TEST:
        pytest.skip("triton was imported before TRITON_INTERPRET=1; a child process runs this test")


def _run_child(test_file: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider"],
                          cwd=REPO, env={**os.environ, "TRITON_INTERPRET": "1", TORCH_THREADS_ENV: "1",
                                             "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S)


def _start_children(test_file: Path) -> None:
    """Every session child not yet started, `test_file`'s first, CONCURRENT_CHILDREN at a time."""
    pool = ThreadPoolExecutor(CONCURRENT_CHILDREN, thread_name_prefix="interpreter-child")
    for path in [test_file, *session_child_files]:
        if path not in _children:
            _children[path] = pool.submit(_run_child, path)
    pool.shutdown(wait=False)


def run_in_fresh_interpreter(test_file: str, interpreted: bool) -> None:
    """The body of a module's CHILD_TEST: run `test_file` in a child pytest with the interpreter on
    (or wait for the child the session already started for it)."""
    if interpreted:
        pytest.skip("the kernels run in this process")
    path = Path(test_file).resolve()
    if path not in _children:
        _start_children(path)
    # Queued behind at most the children started before it, each bounded by CHILD_TIMEOUT_S.
    child = _children[path].result()
    assert child.returncode == 0, f"{child.stdout[-6000:]}\n{child.stderr[-2000:]}"
