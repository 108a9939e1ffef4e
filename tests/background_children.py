"""Test modules run in child pytest processes at the lowest CPU priority, beside the rest of the run.

The system tests leave about a quarter of the two cores idle: they mostly wait on servers, deadlines
and timeouts. Modules of pure computation (the Triton interpreter's kernels, tests/triton_interpreter.py;
the structured-output masks over the whole vocabulary) need no timing and no server, so a run starts
them as children when collection ends (tests/conftest.py), CONCURRENT_CHILDREN at a time and at nice 19:
they take only the cycles the other tests leave, and a test beside them keeps its core. The module's
child test (one of CHILD_TESTS) runs last and passes or fails with its child; in the parent its other
tests skip, saying where they ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

# A module's test that stands for the whole module run in a child.
INTERPRETER_CHILD_TEST = "test_kernels_in_a_fresh_interpreter"  # with TRITON_INTERPRET=1
PLAIN_CHILD_TEST = "test_module_in_a_background_child"
CHILD_TESTS = (INTERPRETER_CHILD_TEST, PLAIN_CHILD_TEST)
CONCURRENT_CHILDREN = 2
CHILD_NICENESS = 19
# Set in a child: the module runs its own tests. A child's torch threads (tests/conftest.py): one,
# with CONCURRENT_CHILDREN sharing two cores.
IN_CHILD_ENV = "CADENCE_TEST_IN_CHILD"
TORCH_THREADS_ENV = "CADENCE_TEST_TORCH_THREADS"
CHILD_TIMEOUT_S = 600
REPO = Path(__file__).resolve().parent.parent

_children: dict[Path, Future] = {}
_running: set[subprocess.Popen] = set()


def in_child() -> bool:
    return os.environ.get(IN_CHILD_ENV) == "1"


def skip_in_parent(request: pytest.FixtureRequest) -> None:
    """For a PLAIN_CHILD_TEST module's autouse fixture: its tests skip here when the run started
    the module's child (not when -k left its child test out: then they run here)."""
    if request.node.originalname not in CHILD_TESTS and Path(request.node.path).resolve() in _children:
        pytest.skip("runs in a background child process (tests/background_children.py)")


def _run_child(test_file: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider"]
    env = {**os.environ, **env, IN_CHILD_ENV: "1", TORCH_THREADS_ENV: "1", "OMP_NUM_THREADS": "1"}
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


def start_children(children: dict[Path, dict[str, str]]) -> None:
    """Start a child for every test file of `children` (file -> its extra environment) not yet
    started, CONCURRENT_CHILDREN at a time, in the background: a child test then waits for its own."""
    pool = ThreadPoolExecutor(CONCURRENT_CHILDREN, thread_name_prefix="test-child")
    for path, env in children.items():
        if path not in _children:
            _children[path] = pool.submit(_run_child, path, env)
    pool.shutdown(wait=False)


def stop_children() -> None:
    """At the session's end: a child no test waited for (the run stopped early) is not left running,
    nor waited for."""
    for future in _children.values():
        future.cancel()
    for child in list(_running):
        child.kill()


def run_in_background_child(test_file: str, env: dict[str, str] | None = None) -> None:
    """The body of a module's child test: wait for the child the session started for `test_file`
    (or start it with `env`, when the test runs on its own) and fail with its output if it failed."""
    path = Path(test_file).resolve()
    start_children({path: env or {}})
    # Queued behind at most the children started before it, each bounded by CHILD_TIMEOUT_S.
    child = _children[path].result()
    assert child.returncode == 0, f"{child.stdout[-6000:]}\n{child.stderr[-2000:]}"
