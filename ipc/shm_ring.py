"""The step-plan ring of one replica: K fixed-size slots in one /dev/shm segment.

The scheduler (the one writer) packs each StepPlan into the next slot and then rings the replica's
doorbell with (step_id, slot); every TP executor of the replica (the readers) reads that slot as
zero-copy views, copies the plan to its GPU and marks the step consumed. A slot is reused only after
every reader consumed the step it last held, and a wait that runs out names the stuck rank, the step
and the slot, never just "no block available".

Segment layout (all header words int64):

    [0, 64)               magic, version, num_slots, slot_bytes, num_readers, slots_offset, 2 spare
    [64, ...)             slot_step[num_slots]: the step a slot holds (-1 empty, -2 being written)
    [..., slots_offset)   per TP rank one cache line (so ranks polling their own words do not fight
                          over one line): word 0 the last step it consumed, word 1 the last it took
                          (read off the ring; consumed once its step is done with the slot)
    [slots_offset, ...)   num_slots slots of slot_bytes, page-aligned, each a pack_plan buffer

Memory ordering: we rely on x86-64 (TSO): aligned 8-byte stores are atomic, and stores become
visible to other cores in program order, as do loads. The writer stores the payload, then the slot's
step id, so a reader that sees the step id sees the whole payload; a reader stores its consumed word
only after it is done with the slot. numpy performs each store in C with no reordering across
Python statements. A weakly ordered CPU (ARM) would need a release/acquire fence around those two
stores; Cadence does not support one here.

Step ids increase: the writer refuses a step id at or below the last one it wrote, and a reader's
consumed word only moves forward, so "consumed >= step" means "done with that step".
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections.abc import Callable

import numpy as np

from core.plan import StepPlan
from ipc.plan_layout import pack_plan, packed_plan_header, plan_nbytes, unpack_plan

SHM_DIR = "/dev/shm"

_MAGIC = 0x43_44_4E_43_52_49_4E_47  # "CDNCRING"
_VERSION = 1
_LINE = 64  # bytes: cache line, and the alignment pack_plan uses for its arrays
_PAGE = 4096
_LINE_WORDS = _LINE // 8
_EMPTY = -1  # slot_step / consumed word before anything was written or consumed
_WRITING = -2  # slot_step while the writer overwrites the slot's payload

# Waiting: spin this long (a shared-memory round trip is about a microsecond), then sleep with a
# doubling nap, so that a stuck peer costs at most a wake-up per millisecond on a busy 2-core box.
_SPIN_S = 50e-6
_FIRST_NAP_S = 20e-6
_MAX_NAP_S = 1e-3


class RingError(RuntimeError):
    """The ring's contract was broken: a slot holds another step, a step id went backwards."""


class RingTimeout(RingError, TimeoutError):
    """A wait on the ring ran out; the message names the rank, the step and the slot."""


def ring_name(run_id: str, replica: int) -> str:
    """The /dev/shm name of replica `replica`'s ring in run `run_id`; `run_prefix` covers it."""
    return f"{run_prefix(run_id)}ring-dp{replica}"


def run_prefix(run_id: str) -> str:
    """The prefix of every segment of one run, for `cleanup_stale` after a crash."""
    return f"cadence-{run_id}-"


def cleanup_stale(prefix: str) -> list[str]:
    """Remove every /dev/shm segment whose name starts with `prefix`; returns the names removed.

    The launcher calls this after a crash (segments outlive their processes) and before a start.
    """
    _check_name(prefix)
    removed = []
    for entry in os.listdir(SHM_DIR):
        if entry.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, entry))
            except FileNotFoundError:  # another cleaner got there first
                continue
            removed.append(entry)
    return sorted(removed)


def _check_name(name: str) -> None:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"shared-memory name {name!r} must be non-empty, without '/' or a leading '.'")


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _wait_for(ready: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `ready` for up to `timeout_s`: a short spin, then naps; never an unbounded spin."""
    if ready():
        return True
    start = time.monotonic()
    deadline, spin_until, nap_s = start + timeout_s, start + _SPIN_S, _FIRST_NAP_S
    while True:
        if ready():
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        if now >= spin_until:
            time.sleep(min(nap_s, deadline - now))
            nap_s = min(2 * nap_s, _MAX_NAP_S)


class _Layout:
    """Byte offsets of the header regions and the slots, derived once from the ring's shape."""

    def __init__(self, num_slots: int, slot_bytes: int, num_readers: int):
        self.num_slots, self.slot_bytes, self.num_readers = num_slots, slot_bytes, num_readers
        self.slot_step_word = _LINE_WORDS
        self.consumed_word = self.slot_step_word + _round_up(num_slots, _LINE_WORDS)
        self.header_bytes = (self.consumed_word + num_readers * _LINE_WORDS) * 8
        self.slots_offset = _round_up(self.header_bytes, _PAGE)
        self.total_bytes = self.slots_offset + num_slots * slot_bytes


class StepRing:
    """One replica's ring. `create` makes the writer's handle, `attach` a reader's (one TP rank)."""

    def __init__(self, name: str, buf: mmap.mmap, layout: _Layout, rank: int | None):
        self.name = name
        self.num_slots = layout.num_slots
        self.slot_bytes = layout.slot_bytes
        self.num_readers = layout.num_readers
        self.rank = rank  # None for the writer
        self._mmap: mmap.mmap | None = buf
        self._layout = layout
        self._words = np.frombuffer(buf, dtype=np.int64, count=layout.header_bytes // 8)
        self._slot_step = self._words[layout.slot_step_word : layout.slot_step_word + layout.num_slots]
        consumed = self._words[layout.consumed_word : layout.consumed_word + layout.num_readers * _LINE_WORDS]
        self._consumed = consumed[::_LINE_WORDS]  # [num_readers], one word per cache line
        self._taken = consumed[1::_LINE_WORDS]  # [num_readers], the second word of each
        self._next_slot = 0
        self._last_written: int | None = None
        self._cuda_ptr: int | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def create(cls, name: str, num_slots: int, slot_bytes: int, num_readers: int) -> StepRing:
        """Create the segment `name` in /dev/shm (it must not exist) and return the writer's handle."""
        _check_name(name)
        if num_slots < 1 or slot_bytes < 1 or num_readers < 1:
            raise ValueError(
                f"ring {name} needs num_slots, slot_bytes and num_readers >= 1, "
                f"got {num_slots}, {slot_bytes}, {num_readers}"
            )
        layout = _Layout(num_slots, _round_up(slot_bytes, _LINE), num_readers)
        # Build the segment under a private name, then link it into place: a reader attaching at
        # any moment sees either no ring or a fully initialised one, and link() fails if one exists.
        path = os.path.join(SHM_DIR, name)
        tmp_path = f"{path}.tmp-{os.getpid()}"
        fd = os.open(tmp_path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, layout.total_bytes)
            buf = mmap.mmap(fd, layout.total_bytes)
            words = np.frombuffer(buf, dtype=np.int64, count=layout.header_bytes // 8)
            words[layout.slot_step_word :] = _EMPTY
            words[:6] = (_MAGIC, _VERSION, num_slots, layout.slot_bytes, num_readers, layout.slots_offset)
            del words
            try:
                os.link(tmp_path, path)
            except FileExistsError:
                buf.close()
                raise FileExistsError(
                    f"ring {name} already exists in {SHM_DIR}; a crashed run left it? "
                    f"cleanup_stale() removes it"
                ) from None
        finally:
            os.close(fd)
            os.unlink(tmp_path)
        return cls(name, buf, layout, rank=None)

    @classmethod
    def attach(cls, name: str, rank: int) -> StepRing:
        """Map the existing ring `name` as reader `rank` (the executor's TP rank)."""
        _check_name(name)
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"ring {name} does not exist in {SHM_DIR}; has the scheduler created it?"
            ) from None
        try:
            buf = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        magic, version, num_slots, slot_bytes, num_readers, slots_offset = (
            int(w) for w in np.frombuffer(buf, dtype=np.int64, count=6)
        )
        if magic != _MAGIC or version != _VERSION:
            buf.close()
            raise RingError(f"{path} is not a Cadence step ring (version {_VERSION})")
        layout = _Layout(num_slots, slot_bytes, num_readers)
        if layout.slots_offset != slots_offset or layout.total_bytes != len(buf):
            size = len(buf)
            buf.close()
            raise RingError(f"ring {name} is {size} bytes, its header describes {layout.total_bytes}")
        if not 0 <= rank < num_readers:
            buf.close()
            raise ValueError(f"ring {name} has readers tp=0..{num_readers - 1}, not tp={rank}")
        return cls(name, buf, layout, rank=rank)

    def close(self) -> None:
        """Unmap this handle; safe to call twice. The segment stays until the writer unlinks it."""
        if self._mmap is None:
            return
        self._unregister_cuda()
        buf, self._mmap = self._mmap, None
        del self._words, self._slot_step, self._consumed, self._taken
        # Plans read from the ring may still hold views; then the mapping goes with the last of them.
        with contextlib.suppress(BufferError):
            buf.close()

    def unlink(self) -> None:
        """Remove the segment from /dev/shm (the writer, at shutdown); safe to call twice."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, self.name))

    def __enter__(self) -> StepRing:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def register_with_cuda(self) -> bool:
        """Pin the segment with cudaHostRegister so plan copies to the GPU are one async DMA.

        Returns whether it did: without CUDA this is a no-op. `close` unregisters.
        """
        import torch  # only executors call this; the scheduler need not import torch

        if self._cuda_ptr is not None or not torch.cuda.is_available():
            return self._cuda_ptr is not None
        ptr = np.frombuffer(self._buf(), dtype=np.uint8).ctypes.data
        err = torch.cuda.cudart().cudaHostRegister(ptr, self._layout.total_bytes, 0)
        if int(err) != 0:
            raise RingError(
                f"cudaHostRegister of ring {self.name} ({self._layout.total_bytes} bytes) "
                f"failed with CUDA error {int(err)}"
            )
        self._cuda_ptr = ptr
        return True

    def _unregister_cuda(self) -> None:
        if self._cuda_ptr is not None:
            import torch

            torch.cuda.cudart().cudaHostUnregister(self._cuda_ptr)
            self._cuda_ptr = None

    # --- writer ---------------------------------------------------------------------------------

    def write(self, plan: StepPlan, timeout_s: float) -> int:
        """Pack `plan` into the next slot and return the slot's index, for the doorbell.

        Waits until every reader consumed the step the slot held before; raises RingTimeout naming
        the stuck reader(s) after `timeout_s`, ValueError if the plan does not fit a slot.
        """
        self._buf()  # raises if closed
        if self.rank is not None:
            raise RingError(f"ring {self.name}: reader tp={self.rank} cannot write")
        nbytes = plan_nbytes(plan)
        if nbytes > self.slot_bytes:
            raise ValueError(
                f"ring {self.name}: step {plan.step_id} packs to {nbytes} bytes, "
                f"a slot holds {self.slot_bytes}"
            )
        if plan.step_id < 0 or (self._last_written is not None and plan.step_id <= self._last_written):
            raise RingError(
                f"ring {self.name}: step ids must increase, "
                f"got step {plan.step_id} after {self._last_written}"
            )
        slot = self._next_slot
        old_step = int(self._slot_step[slot])
        if old_step >= 0 and not _wait_for(lambda: not self._stuck_readers(old_step), timeout_s):
            stuck = self._stuck_readers(old_step)
            who = ", ".join(f"tp={r}" for r in stuck)
            raise RingTimeout(
                f"ring {self.name}: reader{'s' if len(stuck) > 1 else ''} {who} did not consume step "
                f"{old_step} (slot {slot}) within {timeout_s:g} s; writing step {plan.step_id} waits on it"
            )
        # Payload first, step id last: a reader that sees the new step id sees the whole plan.
        self._slot_step[slot] = _WRITING
        pack_plan(plan, self._slot_view(slot))
        self._slot_step[slot] = plan.step_id
        self._next_slot = (slot + 1) % self.num_slots
        self._last_written = plan.step_id
        return slot

    def stuck_readers(self) -> list[int]:
        """The readers that hold the next slot (they have not consumed the step it carries): write()
        would wait on them. Empty when the next write goes through at once."""
        self._buf()  # raises if closed
        old_step = int(self._slot_step[self._next_slot])
        return self._stuck_readers(old_step) if old_step >= 0 else []

    def _stuck_readers(self, step_id: int) -> list[int]:
        return [int(r) for r in np.flatnonzero(self._consumed < step_id)]

    # --- reader ---------------------------------------------------------------------------------

    def read(self, step_id: int, slot: int, timeout_s: float) -> StepPlan:
        """The plan of `step_id` in `slot`, as views into the ring (do not write to them).

        The doorbell announced (step_id, slot); if the slot's header does not show the step yet,
        wait up to `timeout_s` for it. Raises RingError if the slot holds a later step (the
        announcement was wrong) and RingTimeout if it never shows the announced one.
        """
        self._buf()  # raises if closed
        if not 0 <= slot < self.num_slots:
            raise RingError(
                f"ring {self.name}: step {step_id} announced in slot {slot}, "
                f"the ring has slots 0..{self.num_slots - 1}"
            )
        if not _wait_for(lambda: self._slot_step[slot] >= step_id, timeout_s):
            raise RingTimeout(
                f"ring {self.name}: reader tp={self.rank} waited {timeout_s:g} s for step {step_id} "
                f"in slot {slot}, which holds {self._describe(int(self._slot_step[slot]))}"
            )
        held = int(self._slot_step[slot])
        view = self._slot_view(slot)
        if held != step_id or packed_plan_header(view)[0] != step_id:
            raise RingError(
                f"ring {self.name}: reader tp={self.rank} expected step {step_id} in slot {slot}, "
                f"it holds {self._describe(held)}"
            )
        return unpack_plan(view)

    def slot_of(self, step_id: int) -> int | None:
        """The slot whose header shows `step_id` now, or None: what a reader spins on between steps."""
        self._buf()  # raises if closed
        hits = np.flatnonzero(self._slot_step == step_id)
        return int(hits[0]) if len(hits) else None

    def consumed(self, step_id: int) -> None:
        """Mark `step_id` done by this reader (after its plan was copied off the ring)."""
        self._buf()  # raises if closed
        if self.rank is None:
            raise RingError(f"ring {self.name}: the writer has no consumed word")
        last = int(self._consumed[self.rank])
        if step_id < last:
            raise RingError(f"ring {self.name}: reader tp={self.rank} consumed step {step_id} after {last}")
        self._consumed[self.rank] = step_id

    def took(self, step_id: int) -> None:
        """Mark `step_id` taken by this reader (its plan in hand, from the ring or the doorbell): what
        tells a rank stuck inside a step from one that never got it."""
        self._buf()  # raises if closed
        if self.rank is None:
            raise RingError(f"ring {self.name}: the writer takes no steps")
        self._taken[self.rank] = max(step_id, int(self._taken[self.rank]))

    def consumed_steps(self) -> list[int]:
        """The last step each reader consumed, by rank (-1: none yet); for stats and tests."""
        return [int(s) for s in self._consumed]

    def taken_steps(self) -> list[int]:
        """The last step each reader took off the ring, by rank (-1: none yet): a rank that took a
        step and has not consumed it is inside it."""
        return [int(s) for s in self._taken]

    # --- helpers --------------------------------------------------------------------------------

    def _buf(self) -> mmap.mmap:
        if self._mmap is None:
            raise RingError(f"ring {self.name} is closed")
        return self._mmap

    def _slot_view(self, slot: int) -> memoryview:
        start = self._layout.slots_offset + slot * self.slot_bytes
        return memoryview(self._buf())[start : start + self.slot_bytes]

    @staticmethod
    def _describe(held: int) -> str:
        if held == _EMPTY:
            return "nothing yet"
        if held == _WRITING:
            return "a step being written"
        return f"step {held}"
