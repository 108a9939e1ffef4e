"""Programmatic dependent launch (PDL) for the decode step's Triton kernels.

A decode step at one row is ~600 short kernels; between two of them the GPU drains the first, then
ramps the second up from nothing. With PDL (Hopper and later) a kernel is launched while its
predecessor still runs: its programs start as the predecessor's last ones finish, do what does not
depend on the predecessor (the row GEMV issues its first weight loads), and wait for the
predecessor's writes at `gdc_wait()`. A kernel opts in with `launch_pdl=True` at launch and
`PDL=True` (a constexpr), under which it calls

  gdc_launch_dependents()  first: the next kernel may start once every program has got here;
  gdc_wait()               before its first read of a predecessor's output and before any write.

Every PDL kernel waits before it writes or ends, so a kernel that completes implies that its
predecessors completed: the ordering the stream promised is kept along a chain. CUDA graph capture
keeps the dependency as a programmatic edge.

Before its wait a kernel may read only what no kernel of the forward writes: weights, the step's
metadata (positions, KV slots, sequence lengths, block tables: copied or computed before the
forward's first kernel, the embedding lookup, which launches the ordinary way and so starts only
once they are complete), and KV pages of earlier steps. Its predecessors along the chain may still
be running then, not just the one before it.

`CADENCE_PDL=0` turns it off (the kernels then launch as before); it is off where the device or
the stack cannot do it (before sm_90, the CPU, the Triton interpreter, a triton before 3.3, which
has neither `gdc_wait` nor the `launch_pdl` launch option: launches then pass no PDL option at all,
`launch_options`).
"""

from __future__ import annotations

import functools
import os

import torch

try:  # triton 3.3 and later; the kernels import them from here
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # no triton, or an older one: PDL stays off, and the kernels' PDL branches, which
    gdc_launch_dependents = gdc_wait = None  # are compiled only when it is on, never call these


@functools.cache
def _enabled_on(device_index: int) -> bool:
    if gdc_wait is None or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if os.environ.get("CADENCE_PDL", "1") == "0":
        return False
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def reread_environment() -> None:
    """Forget the cached answers, so that the next launches read CADENCE_PDL again."""
    _enabled_on.cache_clear()


def dependent_launch(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL."""
    if device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _enabled_on(index)


def launch_options(pdl: bool) -> dict:
    """The launch keywords of a PDL kernel launch: none when off (an older triton knows no `launch_pdl`)."""
    return {"launch_pdl": True} if pdl else {}
