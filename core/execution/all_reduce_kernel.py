"""The one-shot all-reduce as a Triton kernel (GPU; the CPU interpreter in tests).

Every rank owns one exchange buffer that every other rank of the group has mapped into its own
address space (core/execution/custom_all_reduce.py sets that up): two data halves of `capacity`
elements, used in turn, then a flag per (source rank, program). One call on every rank, the same
grid everywhere, and for each program `p`:

1. `epoch` = this program's call count + 1 (kept on the device, in `epochs[p]`, so that a CUDA
   graph replays the kernel with nothing baked in); the call's data half is `epoch % 2`.
2. Copy this program's elements of `x` into this rank's own buffer, then, after a barrier of the
   program's threads, write `epoch` into flag (this rank, p) of every rank's buffer (a release at
   system scope: a peer that sees the flag sees the data).
3. Wait until every rank's flag (r, p) in this rank's buffer has reached `epoch` (an acquire).
4. Sum the program's elements over every rank's buffer, in float32, into `x`.

Why two halves are enough: a rank writes half `e % 2` in call e only after it finished call e - 1,
and it finished call e - 1 only after every peer had flagged e - 1, which a peer does after it
finished reading call e - 2, the last to read that half. A peer's flag is therefore always e or
e + 1 while this rank waits for e, never e + 2, so "flag - epoch >= 0" (int32, wrapping) is the
wait's whole condition.

Every rank launches at most MAX_PROGRAMS programs (far below the SM count, so that all of them are
resident and a waiting program never keeps a peer's program from being scheduled); program p
handles chunks p, p + grid, p + 2 grid, ... of CHUNK elements.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Elements per chunk and the most programs per call (one flag per program and source rank).
CHUNK = 1024
MAX_PROGRAMS = 32


@triton.jit
def _one_shot_all_reduce_kernel(x_ptr, num_elements, data_ptrs, flag_ptrs, epochs_ptr, rank: tl.constexpr,
                                world: tl.constexpr, max_programs: tl.constexpr, capacity,
                                CHUNK: tl.constexpr):
    program = tl.program_id(0)
    num_programs = tl.num_programs(0)
    epoch = tl.load(epochs_ptr + program) + 1
    half = (epoch & 1).to(tl.int64) * capacity
    dtype = x_ptr.dtype.element_ty
    offsets = tl.arange(0, CHUNK)
    own = tl.load(data_ptrs + rank).to(tl.pointer_type(dtype)) + half
    for start in range(program * CHUNK, num_elements, num_programs * CHUNK):
        at = start + offsets
        tl.store(own + at, tl.load(x_ptr + at, mask=at < num_elements), mask=at < num_elements)
    tl.debug_barrier()  # every thread's copy is done before the flags go out
    for peer in tl.static_range(world):
        peer_flags = tl.load(flag_ptrs + peer).to(tl.pointer_type(tl.int32))
        tl.atomic_xchg(peer_flags + rank * max_programs + program, epoch, sem="release", scope="sys")
    my_flags = tl.load(flag_ptrs + rank).to(tl.pointer_type(tl.int32))
    for peer in tl.static_range(world):
        flag = my_flags + peer * max_programs + program
        while tl.atomic_add(flag, 0, sem="acquire", scope="sys") - epoch < 0:
            pass
    tl.debug_barrier()  # no thread reads a peer's data before the flags are in
    for start in range(program * CHUNK, num_elements, num_programs * CHUNK):
        at = start + offsets
        total = tl.zeros([CHUNK], tl.float32)
        for peer in tl.static_range(world):
            data = tl.load(data_ptrs + peer).to(tl.pointer_type(dtype)) + half
            total += tl.load(data + at, mask=at < num_elements, other=0.0, volatile=True).to(tl.float32)
        tl.store(x_ptr + at, total.to(dtype), mask=at < num_elements)
    tl.store(epochs_ptr + program, epoch)


def one_shot_all_reduce(x: torch.Tensor, data_ptrs: torch.Tensor, flag_ptrs: torch.Tensor,
                        epochs: torch.Tensor, rank: int, world: int, capacity: int) -> torch.Tensor:
    """Sum the contiguous `x` over the ranks in place. `data_ptrs` / `flag_ptrs` (int64, on x's
    device): every rank's data halves and flags as mapped here; `capacity`: elements per half."""
    num_elements = x.numel()
    grid = (max(1, min(MAX_PROGRAMS, triton.cdiv(num_elements, CHUNK))),)
    _one_shot_all_reduce_kernel[grid](x, num_elements, data_ptrs, flag_ptrs, epochs, rank, world,
                                      MAX_PROGRAMS, capacity, CHUNK=CHUNK)
    return x
