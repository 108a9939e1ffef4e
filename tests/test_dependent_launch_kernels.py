"""The PDL contract of core/execution/dependent_launch.py, read from the kernels' source: a kernel that
launches with programmatic dependent launch calls `gdc_launch_dependents()` and `gdc_wait()`, stores
nothing and returns nowhere before its wait (so a kernel that completes implies its predecessors
did), and before the wait loads only through the pointers named here: weights and the step's
metadata, which no kernel of the forward writes. A kernel that read an activation before its wait
could read it half written; this test names the kernel and the pointer."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]')")

from core.execution.attention import triton_decode, triton_kv_write  # noqa: E402
from core.execution.model import fp8_kernels, fp8_row_gemv, fused  # noqa: E402

# What each PDL kernel may load before its wait (its pointer arguments).
BEFORE_THE_WAIT = {
    "_quantize_groups_kernel": set(),
    "_row_gemv_kernel": {"w_ptr", "ws_ptr"},
    "_rms_norm_kernel": {"weight_ptr"},
    "_qk_norm_rope_kernel": {"positions_ptr", "cos_ptr", "sin_ptr"},
    "_silu_mul_kernel": set(),
    "_write_kv_kernel": {"kv_index_ptr"},
    "_decode_split_kernel": {"query_start_ptr", "seq_lens_ptr"},
    "_decode_reduce_kernel": {"query_start_ptr", "seq_lens_ptr"},
}
MODULES = (fp8_kernels, fp8_row_gemv, fused, triton_decode, triton_kv_write)


def jitted(obj) -> object | None:
    """The Python function behind a triton.jit object (compiled or, under the interpreter, interpreted)."""
    fn = getattr(obj, "fn", None)
    return fn if inspect.isfunction(fn) and not inspect.isfunction(obj) else None


def pdl_kernels() -> dict[str, tuple[object, ast.FunctionDef]]:
    found = {}
    for module in MODULES:
        for name, obj in vars(module).items():
            fn = jitted(obj)
            own = fn is not None and fn.__module__ == module.__name__
            if own and "PDL" in inspect.signature(fn).parameters:
                tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
                found[name] = (module, tree.body[0])
    return found


def calls_to(tree: ast.AST, name: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and ((isinstance(node.func, ast.Name) and node.func.id == name)
                 or (isinstance(node.func, ast.Attribute) and node.func.attr == name))]


def pointers_behind(expression: ast.AST, assigned: dict[str, set[str]]) -> set[str]:
    """The `*_ptr` arguments an expression's address is computed from, through earlier assignments."""
    names = {node.id for node in ast.walk(expression) if isinstance(node, ast.Name)}
    out = {name for name in names if name.endswith("_ptr")}
    for name in names - out:
        out |= assigned.get(name, set())
    return out


def stores_inside(module, function_name: str) -> bool:
    helper = jitted(vars(module).get(function_name))
    return helper is not None and "tl.store" in inspect.getsource(helper)


def test_every_pdl_kernel_is_listed():
    assert set(pdl_kernels()) == set(BEFORE_THE_WAIT)


@pytest.mark.parametrize("name", sorted(BEFORE_THE_WAIT))
def test_nothing_is_written_or_read_early_before_the_wait(name):
    module, function = pdl_kernels()[name]
    assert calls_to(function, "gdc_launch_dependents"), f"{name} never lets its successor launch"
    waits = calls_to(function, "gdc_wait")
    assert waits, f"{name} never waits for its predecessor"
    wait_line = max(call.lineno for call in waits)  # in source order: whatever comes before the last one
    nodes = list(ast.walk(function))
    writes = calls_to(function, "store") + [node for node in nodes if isinstance(node, ast.Return)]
    writes += [call for call in nodes if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
               and stores_inside(module, call.func.id)]
    early = sorted(node.lineno for node in writes if node.lineno < wait_line)
    assert not early, f"{name} writes or returns before its gdc_wait (lines {early} of its source)"
    assigned: dict[str, set[str]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and node.lineno < wait_line:
            for target in node.targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        behind = pointers_behind(node.value, assigned)
                        assigned[leaf.id] = assigned.get(leaf.id, set()) | behind
    loaded = set()
    for call in calls_to(function, "load"):
        if call.lineno < wait_line:
            loaded |= pointers_behind(call.args[0], assigned)
    assert loaded <= BEFORE_THE_WAIT[name], (
        f"{name} loads through {sorted(loaded - BEFORE_THE_WAIT[name])} before its gdc_wait: only weights "
        "and the step's metadata may be read before it (core/execution/dependent_launch.py)")
