"""Prefetch a weight into the GPU's L2 while the step does something that leaves HBM idle.

At one decode row attention reads a few MB of KV a layer (~30 us on an H100) while HBM could move
~90 MB in that time; o_proj's product then reads its 26 MB FP8 weight (Qwen3-14B) from HBM right after.
`prefetch_l2(weight)` launches a tiny kernel that asks the memory system for the weight's bytes with
Hopper's bulk L2 prefetch (`cp.async.bulk.prefetch.L2.global`, a hint with no result and nothing to
wait for) and ends at once; attention then runs while the bytes arrive, and the product finds them
in L2.

The kernel is a dependent launch (core/execution/dependent_launch.py): it lets the next kernel start
at once and issues its prefetches before it waits, which is allowed, since no kernel of a forward
writes a weight. Each thread of a one-warp program asks for one `PIECE` of the weight.

Off unless `CADENCE_L2_PREFETCH=1`, and only where it can run: sm_90 or later with a triton that has
the dependent launch (the prefetch is PTX of sm_90), never on the CPU or under the Triton
interpreter. The callers decide when it pays: `PREFETCH_MAX_ROWS`.
"""

from __future__ import annotations

import functools
import os

import torch

from core.execution.dependent_launch import dependent_launch, gdc_launch_dependents, gdc_wait, launch_options

try:
    import triton
    import triton.language as tl
except ImportError:  # an install without triton: nothing is prefetched
    triton = None

# A step of up to this many rows reads o_proj's weight at about the time it takes to read it, so a
# copy already in L2 saves most of it; a larger step's product is bound by its arithmetic.
PREFETCH_MAX_ROWS = 16
PIECE = 16384  # bytes one thread asks for: a multiple of 16, as the instruction requires
PIECES = 32  # threads of the one warp a program
# A weight of more than this share of the L2 is not asked for: attention's KV reads and the product's
# own traffic must fit beside it (o_proj's 26 MB of FP8 is half of an H100's or H200's 50 MB L2; in
# bf16 it is 52 MB and is left alone).
L2_SHARE = 0.6


@functools.cache
def _enabled_on(device_index: int) -> bool:
    if os.environ.get("CADENCE_L2_PREFETCH", "0") != "1" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if triton is None or gdc_wait is None:
        return False
    return torch.cuda.get_device_capability(device_index)[0] >= 9


@functools.cache
def _l2_bytes(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).L2_cache_size


def reread_environment() -> None:
    """Forget the cached answers, so that the next calls read CADENCE_L2_PREFETCH again."""
    _enabled_on.cache_clear()


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def l2_prefetch_enabled(device: torch.device) -> bool:
    """Whether `prefetch_l2` issues anything for tensors on `device`."""
    return device.type == "cuda" and _enabled_on(_device_index(device))


if triton is not None:

    @triton.jit
    def _prefetch_l2_kernel(base_ptr, total_bytes, PIECE: tl.constexpr, PIECES: tl.constexpr,
                            PDL: tl.constexpr):
        if PDL:
            gdc_launch_dependents()
        offsets = (tl.program_id(0) * PIECES + tl.arange(0, PIECES)).to(tl.int64) * PIECE
        sizes = tl.minimum(total_bytes - offsets, PIECE).to(tl.int32)
        # A piece past the end has a size <= 0 and asks for nothing.
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; "
            "mov.u32 $0, 0; }",
            "=r,l,r", [base_ptr + offsets, sizes], dtype=tl.int32, is_pure=False, pack=1)
        if PDL:
            gdc_wait()  # a dependent kernel ends only after its predecessors (dependent_launch.py)


def prefetch_l2(weight: torch.Tensor) -> bool:
    """Ask for `weight`'s bytes to be brought into L2; whether anything was issued (nothing where the
    prefetch is off, or for a weight of more than `L2_SHARE` of the L2). The tensor must be
    contiguous; a byte count that is not a multiple of 16 leaves its last few bytes out."""
    if not l2_prefetch_enabled(weight.device):
        return False
    total = weight.numel() * weight.element_size() // 16 * 16
    if total > L2_SHARE * _l2_bytes(_device_index(weight.device)):
        return False
    assert weight.is_contiguous() and weight.data_ptr() % 16 == 0, "a bulk prefetch needs aligned bytes"
    pdl = dependent_launch(weight.device)
    as_bytes = weight.view(-1).view(torch.uint8)
    _prefetch_l2_kernel[(triton.cdiv(total, PIECE * PIECES),)](
        as_bytes, total, PIECE=PIECE, PIECES=PIECES, PDL=pdl, num_warps=1, **launch_options(pdl))
    return True
