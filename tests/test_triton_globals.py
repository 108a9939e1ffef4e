"""Compiled Triton kernels read no module global but a `tl.constexpr`.

Triton on a GPU refuses to compile a @triton.jit function that reads a plain module global ("Cannot
access global variable ... from within @jit'ed function"); the interpreter that runs the kernels in
the CPU tests does not check, so such a kernel passes every CPU test and fails at its first GPU
launch. This test reads every kernel module and finds those reads before a GPU does.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERNEL_FILES = sorted(p for p in (ROOT / "core").rglob("*.py") if "triton.jit" in p.read_text())


def _is_jit(function: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(decorator) for decorator in function.decorator_list)


def _plain_globals(tree: ast.Module) -> set[str]:
    """Names a module assigns at top level to anything but tl.constexpr(...)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            value = node.value
            is_constexpr = isinstance(value, ast.Call) and ast.unparse(value.func).endswith("constexpr")
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not is_constexpr:
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _reads_of_plain_globals(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text())
    plain = _plain_globals(tree)
    found = []
    for function in (n for n in tree.body if isinstance(n, ast.FunctionDef) and _is_jit(n)):
        local = {a.arg for a in function.args.args + function.args.kwonlyargs}
        local |= {t.id for n in ast.walk(function) if isinstance(n, (ast.Assign, ast.AugAssign, ast.For))
                  for t in ast.walk(n.targets[0] if isinstance(n, ast.Assign) else n.target)
                  if isinstance(t, ast.Name)}
        reads = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        found += [f"{function.name} reads {name}" for name in sorted((reads & plain) - local)]
    return found


def test_the_kernel_modules_are_found():
    names = {p.name for p in KERNEL_FILES}
    assert {"fp8_kernels.py", "all_reduce_kernel.py", "sampling_kernels.py", "triton_decode.py"} <= names


@pytest.mark.parametrize("path", KERNEL_FILES, ids=[str(p.relative_to(ROOT)) for p in KERNEL_FILES])
def test_kernels_read_only_constexpr_globals(path):
    assert _reads_of_plain_globals(path) == [], (
        f"{path.relative_to(ROOT)}: make these module globals tl.constexpr(...) or pass them as "
        "tl.constexpr arguments")


def test_a_plain_global_read_by_a_kernel_is_caught(tmp_path):
    module = tmp_path / "kernel.py"
    module.write_text("import triton\nimport triton.language as tl\nSCALE = 2.0\nOK = tl.constexpr(3.0)\n\n"
                      "@triton.jit\ndef k(x_ptr, N: tl.constexpr):\n    y = tl.load(x_ptr) * SCALE * OK\n"
                      "    tl.store(x_ptr, y)\n")
    assert _reads_of_plain_globals(module) == ["k reads SCALE"]
