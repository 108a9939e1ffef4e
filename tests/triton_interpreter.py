"""Triton kernels tested on the CPU under TRITON_INTERPRET=1.

Triton reads TRITON_INTERPRET when it is first imported, so a test module sets it before importing
triton. When another module of the same pytest run imported triton first, the kernels were built
for a GPU: then the module's tests skip here and its `test_kernels_in_a_fresh_interpreter` runs the
whole module again in a child process, where they are interpreted.

The children run beside the rest of the session at the lowest CPU priority
(tests/background_children.py).
"""

from __future__ import annotations

import background_children
import pytest

CHILD_TEST = background_children.INTERPRETER_CHILD_TEST
CHILD_ENV = {"TRITON_INTERPRET": "1"}


def is_interpreted(*kernels: object) -> bool:
    """Whether every one of `kernels` (triton's own, such as tl.zeros, and the module's) was built
    by the interpreter."""
    return all(type(fn).__name__ == "InterpretedFunction" for fn in kernels)


def skip_unless_interpreted(request: pytest.FixtureRequest, interpreted: bool) -> None:
    """For an autouse fixture: skip a kernel test that cannot run in this process."""
    if not interpreted and request.node.originalname != CHILD_TEST:
        pytest.skip("triton was imported before TRITON_INTERPRET=1; a child process runs this test")


def run_in_fresh_interpreter(test_file: str, interpreted: bool) -> None:
    """The body of a module's CHILD_TEST: run `test_file` in a child pytest with the interpreter on
    (or wait for the child the session already started for it)."""
    if interpreted:
        pytest.skip("the kernels run in this process")
    background_children.run_in_background_child(test_file, CHILD_ENV)
