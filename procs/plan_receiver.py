"""How an executor gets its next step: spin briefly on the ring, then block on the doorbell.

Step ids of a replica are consecutive, so between two steps a reader knows which one comes next
and can watch the ring's slot headers for it: a shared-memory load costs about a microsecond,
while waking from a blocked socket costs tens. It spins for at most `spin_s`, then blocks on the
doorbell, which announces every step (and carries pings, stops and the rare plan too large for a
slot). A doorbell for a step already taken from the ring is skipped. `spin_s` is 0 where cores
are scarce: a spinning executor must never starve the scheduler it waits for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from core.plan import StepPlan
from ipc.channels import SubChannel
from ipc.codec import CodecError
from ipc.messages import Ping, StepReady, Stop
from ipc.plan_layout import unpack_plan
from ipc.shm_ring import StepRing

# A doorbell announces a step whose header is already written; this only covers a torn read.
_RING_READ_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Step:
    step_id: int
    plan: StepPlan  # views into the ring (or a doorbell frame) until `done()`
    slot: int  # -1: the plan came as a frame


class BadDoorbell(ValueError):
    """A doorbell frame that did not decode; it was consumed and the receiver goes on."""


class PlanReceiver:
    def __init__(self, doorbell: SubChannel, ring_name: str, rank: int, spin_s: float,
                 register_with_cuda: bool = False) -> None:
        self.doorbell = doorbell
        self.ring_name = ring_name
        self.rank = rank
        self.spin_s = spin_s
        self._register_with_cuda = register_with_cuda
        self.ring: StepRing | None = None
        self.next_step_id: int | None = None  # known once the first step arrived

    def receive(self, timeout_s: float) -> Step | Ping | Stop | None:
        """The next step (or ping, or stop); None when nothing came within `timeout_s`."""
        step = self._spin()
        if step is not None:
            return self._took(step)
        return self._took(self._from_doorbell(time.monotonic() + timeout_s))

    def receive_unless(self, done: Callable[[], bool]) -> Step | Ping | Stop | None:
        """The next step (or ping, or stop) if it comes before `done()` turns true; else None.

        The executor calls this while its GPU runs a step: a plan that arrives in time is launched
        behind it, so the GPU never waits; when the GPU finishes first, the executor replies.
        """
        while True:
            step = self._take_from_ring()
            if step is not None:
                return self._took(step)
            msg = self._from_doorbell(0.0)
            if msg is not None:
                return self._took(msg)
            if done():
                return None

    def _took(self, msg: Step | Ping | Stop | None) -> Step | Ping | Stop | None:
        """`msg`, a step marked taken on the ring (the scheduler's watchdog reads it) if it is one."""
        if isinstance(msg, Step) and (msg.slot >= 0 or self.ring is not None):
            self._ring().took(msg.step_id)
        return msg

    def _from_doorbell(self, deadline: float) -> Step | Ping | Stop | None:
        while True:
            try:
                delivery = self.doorbell.recv_with_frames(max(0.0, deadline - time.monotonic()))
            except CodecError as exc:
                raise BadDoorbell(str(exc)) from exc
            if delivery is None:
                return None
            msg = delivery.message
            if not isinstance(msg, StepReady):
                return msg
            if self.next_step_id is not None and msg.step_id < self.next_step_id:
                continue  # already taken from the ring while spinning
            self.next_step_id = msg.step_id + 1
            if msg.slot < 0:
                return Step(msg.step_id, unpack_plan(delivery.frames[0]), -1)
            plan = self._ring().read(msg.step_id, msg.slot, _RING_READ_TIMEOUT_S)
            return Step(msg.step_id, plan, msg.slot)

    def done(self, step: Step) -> None:
        """The plan's data has been copied off: its slot may be reused."""
        if step.slot >= 0:
            self._ring().consumed(step.step_id)

    def _take_from_ring(self) -> Step | None:
        """The next step if its slot is written already (no waiting)."""
        if self.ring is None or self.next_step_id is None:
            return None
        step_id = self.next_step_id
        slot = self.ring.slot_of(step_id)
        if slot is None:
            return None
        self.next_step_id = step_id + 1
        return Step(step_id, self.ring.read(step_id, slot, _RING_READ_TIMEOUT_S), slot)

    def _spin(self) -> Step | None:
        if self.spin_s <= 0:
            return None
        deadline = time.perf_counter() + self.spin_s
        while (step := self._take_from_ring()) is None:
            if time.perf_counter() > deadline:
                return None
        return step

    def _ring(self) -> StepRing:
        if self.ring is None:
            self.ring = StepRing.attach(self.ring_name, self.rank)
            if self._register_with_cuda:
                self.ring.register_with_cuda()
        return self.ring

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
