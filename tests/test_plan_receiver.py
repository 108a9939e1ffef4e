"""PlanReceiver: steps from the doorbell, from the ring by spinning, and as frames; stale bells skipped."""

from __future__ import annotations

import uuid

from plans import Chunk, make_plan

from ipc.channels import PubChannel, SubChannel
from ipc.messages import Ping, StepReady, Stop
from ipc.plan_layout import pack_plan, packed_plan_nbytes
from ipc.shm_ring import StepRing, cleanup_stale, ring_name, run_prefix
from procs.plan_receiver import PlanReceiver, Step


def _plan(step_id: int, first_token: int = 5):
    return make_plan([Chunk([first_token, 6, 7], 0, [3])], block_size=16, step_id=step_id)


def test_receiver_takes_steps_from_bell_ring_and_frame_in_order(tmp_path):
    run_id = f"recv-{uuid.uuid4().hex[:8]}"
    address = f"ipc://{tmp_path}/doorbell"
    ring = StepRing.create(ring_name(run_id, 0), num_slots=4, slot_bytes=1 << 16, num_readers=1)
    bell = PubChannel.bind(address, name="bell")
    sub = SubChannel.connect(address, name="sub")
    receiver = PlanReceiver(sub, ring_name(run_id, 0), rank=0, spin_s=0.05)
    try:
        for nonce in range(200):  # until the subscription is live
            bell.send(Ping(0, nonce))
            if isinstance(receiver.receive(0.02), Ping):
                break
        while receiver.receive(0.05) is not None:
            pass

        slot = ring.write(_plan(0), timeout_s=1)
        bell.send(StepReady(0, slot))
        first = receiver.receive(5)
        assert isinstance(first, Step) and first.step_id == 0 and first.plan.input_ids[0] == 5
        receiver.done(first)

        # Step 1 is in the ring before its bell rings: the receiver finds it by spinning.
        slot = ring.write(_plan(1, first_token=11), timeout_s=1)
        second = receiver.receive(0)
        assert isinstance(second, Step) and second.step_id == 1 and second.plan.input_ids[0] == 11
        receiver.done(second)
        bell.send(StepReady(1, slot))  # late bell for a step already taken: skipped

        # Step 2 is too large for a slot and comes as a frame; the spin gives up and the bell has it.
        big = _plan(2, first_token=22)
        frame = bytearray(packed_plan_nbytes(big.num_reqs, big.num_tokens, 1, 0))
        pack_plan(big, frame)
        bell.send(StepReady(2, -1), frames=[frame])
        third = receiver.receive(5)
        assert isinstance(third, Step) and (third.step_id, third.slot) == (2, -1)
        assert third.plan.input_ids[0] == 22
        bell.send(Stop())
        assert isinstance(receiver.receive(5), Stop)
        assert ring.consumed_steps() == [1]
    finally:
        receiver.close()
        receiver.doorbell.close()
        bell.close()
        ring.close()
        ring.unlink()
        cleanup_stale(run_prefix(run_id))
