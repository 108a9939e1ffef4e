"""Triton kernels tested on the CPU under TRITON_INTERPRET=1.

Triton reads TRITON_INTERPRET when it is first imported, so a test module sets it before importing
triton. When another module of the same pytest run imported triton first, the kernels were built
for a GPU: then the module's tests skip here and its `test_kernels_in_a_fresh_interpreter` runs the
whole module again in a child process, where they are interpreted.

The children are pure computation on one core each, ~380 CPU-seconds in all, while the system tests
leave about a quarter of the two cores idle (they mostly wait on servers, deadlines and timeouts). So
a run starts every module's child when collection ends (tests/conftest.py), two at a time and at the
lowest CPU priority (nice 19): they take only the cycles the other tests leave, and the session's
CHILD_TESTs run last, each waiting for its child's result.
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
# A child's CPU priority: the lowest, so that a test beside it keeps its core (what a test times or
# waits for is not slowed by the children).
CHILD_NICENESS = 19
# A child's torch threads (tests/conftest.py): one, with CONCURRENT_CHILDREN sharing two cores.
TORCH_THREADS_ENV = "CADENCE_TEST_TORCH_THREADS"
CHILD_TIMEOUT_S = 600
REPO = Path(__file__).resolve().parent.parent

_children: dict[Path, Future] = {}
_running: set[subprocess.Popen] = set()


def is_interpreted(*kernels: object) -> bool:
    """Whether every one of `kernels` (triton's own, such as tl.zeros, and the module's) was built
    by the interpreter."""
    return all(type(fn).__name__ == "InterpretedFunction" for fn in kernels)


def skip_unless_interpreted(request: pytest.FixtureRequest, interpreted: bool) -> None:
    """For an autouse fixture: skip a kernel test that cannot run in this process."""
    if not interpreted and request.node.originalname != CHILD_TEST:
        pytest.skip("triton was imported before TRITON_INTERPRET=1; a child process runs this test")


def _run_child(test_file: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider"]
    env = {**os.environ, "TRITON_INTERPRET": "1", TORCH_THREADS_ENV: "1", "OMP_NUM_THREADS": "1"}
    with subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as child:
        os.setpriority(os.PRIO_PROCESS, child.pid, CHILD_NICENESS)  # before its imports are done
        _running.add(child)
        try:
            stdout, stderr = child.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            stdout, stderr = child.communicate()
            stderr += f"\n{test_file.name}: no result within {CHILD_TIMEOUT_S} s"
        finally:
            _running.discard(child)
        return subprocess.CompletedProcess(command, child.returncode, stdout, stderr)


def start_children(test_files: list[Path]) -> None:
    """Start every child of `test_files` not yet started, CONCURRENT_CHILDREN at a time, in the
    background: a CHILD_TEST then waits only for its own."""
    pool = ThreadPoolExecutor(CONCURRENT_CHILDREN, thread_name_prefix="interpreter-child")
    for path in test_files:
        if path not in _children:
            _children[path] = pool.submit(_run_child, path)
    pool.shutdown(wait=False)


def stop_children() -> None:
    """At the session's end: a child no test waited for (the run stopped early) is not left running,
    nor waited for."""
    for future in _children.values():
        future.cancel()
    for child in list(_running):
        child.kill()


def run_in_fresh_interpreter(test_file: str, interpreted: bool) -> None:
    """The body of a module's CHILD_TEST: run `test_file` in a child pytest with the interpreter on
    (or wait for the child the session already started for it)."""
    if interpreted:
        pytest.skip("the kernels run in this process")
    path = Path(test_file).resolve()
    start_children([path])  # already started with the session's others unless run on its own
    # Queued behind at most the children started before it, each bounded by CHILD_TIMEOUT_S.
    child = _children[path].result()
    assert child.returncode == 0, f"{child.stdout[-6000:]}\n{child.stderr[-2000:]}"
