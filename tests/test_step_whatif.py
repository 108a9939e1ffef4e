"""benchmarks/step_whatif.py patches the model code by name; every name it patches must still exist,
or a variant would time the unchanged step and call it a removal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import step_whatif

REPO = Path(__file__).resolve().parent.parent


def test_every_variant_patches_names_the_code_has():
    # a fresh interpreter: the patches are global and would leak into the other tests
    code = ("from benchmarks import step_whatif\n"
            "for variant in step_whatif.PATCHES:\n"
            "    step_whatif.apply(variant)\n"
            "print('patched', len(step_whatif.PATCHES))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"patched {len(step_whatif.PATCHES)}"


def test_a_renamed_target_fails_loudly():
    class Module:
        present = 1

    step_whatif._replace(Module, "present", 2)
    assert Module.present == 2
    with pytest.raises(AttributeError, match="has no absent: update benchmarks/step_whatif.py"):
        step_whatif._replace(Module, "absent", 3)
