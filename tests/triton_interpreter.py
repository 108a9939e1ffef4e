"""Triton kernels tested on the CPU under TRITON_INTERPRET=1.

Triton reads TRITON_INTERPRET when it is first imported, so a test module sets it before importing
triton. When another module of the same pytest run imported triton first, the kernels were built
for a GPU: then the module's tests skip here and its `test_kernels_in_a_fresh_interpreter` runs the
whole module again in a child process, where they are interpreted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD_TEST = "test_kernels_in_a_fresh_interpreter"


def is_interpreted(*kernels: object) -> bool:
    """Whether every one of `kernels` (triton's own, such as tl.zeros, and the module's) was built
    by the interpreter."""
    return all(type(fn).__name__ == "InterpretedFunction" for fn in kernels)


def skip_unless_interpreted(request: pytest.FixtureRequest, interpreted: bool) -> None:
    """For an autouse fixture: skip a kernel test that cannot run in this process."""
    if not interpreted and request.node.originalname != CHILD_TEST:
        pytest.skip("triton was imported before TRITON_INTERPRET=1; a child process runs this test")


def run_in_fresh_interpreter(test_file: str, interpreted: bool) -> None:
    """The body of a module's CHILD_TEST: run `test_file` in a child pytest with the interpreter on."""
    if interpreted:
        pytest.skip("the kernels run in this process")
    repo = Path(__file__).resolve().parent.parent
    child = subprocess.run([sys.executable, "-m", "pytest", str(Path(test_file).resolve()), "-q", "-p",
                            "no:cacheprovider"], cwd=repo, env={**os.environ, "TRITON_INTERPRET": "1"},
                           capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, f"{child.stdout[-6000:]}\n{child.stderr[-2000:]}"
