"""The step-plan ring: plans round-trip, slots are reused only when every TP rank is done, and every
failure names the ring, the rank, the step and the slot."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import uuid
from dataclasses import fields

import numpy as np
import pytest
from plans import Chunk, make_plan

from core.plan import StepPlan
from ipc.plan_layout import packed_plan_nbytes
from ipc.shm_ring import SHM_DIR, RingError, RingTimeout, StepRing, cleanup_stale, ring_name, run_prefix

SLOT_BYTES = 4096


@pytest.fixture
def run_id():
    run_id = f"test{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield run_id
    cleanup_stale(run_prefix(run_id))


def plan_for(step_id: int, num_tokens: int = 5) -> StepPlan:
    token_ids = list(range(100 + step_id, 100 + step_id + num_tokens))
    pages = [step_id, *range(1000, 1000 + num_tokens // 16)]
    chunks = [
        Chunk(token_ids, start=0, pages=pages),
        Chunk([7], start=3, pages=[4], temperature=0.5, seed=step_id),
    ]
    return make_plan(chunks, block_size=16, step_id=step_id)


def assert_plans_equal(got: StepPlan, want: StepPlan) -> None:
    assert (got.step_id, got.replica) == (want.step_id, want.replica)
    for f in fields(StepPlan):
        if f.name not in ("step_id", "replica"):
            np.testing.assert_array_equal(getattr(got, f.name), getattr(want, f.name), err_msg=f.name)


def shm_entries(prefix: str) -> list[str]:
    return sorted(e for e in os.listdir(SHM_DIR) if e.startswith(prefix))


def test_plans_round_trip_as_views_and_slots_cycle(run_id):
    name = ring_name(run_id, 0)
    with StepRing.create(name, num_slots=2, slot_bytes=SLOT_BYTES, num_readers=1) as writer:
        with StepRing.attach(name, rank=0) as reader:
            for step_id, want_slot in [(0, 0), (1, 1), (2, 0), (3, 1)]:
                want = plan_for(step_id)
                slot = writer.write(want, timeout_s=1.0)
                assert slot == want_slot
                got = reader.read(step_id, slot, timeout_s=1.0)
                assert_plans_equal(got, want)
                assert not got.input_ids.flags.owndata  # a view into the ring, not a copy
                reader.consumed(step_id)
            assert writer.consumed_steps() == [3]
        writer.unlink()


def _read_in_child(name: str, rank: int, step_id: int, slot: int, out) -> None:
    with StepRing.attach(name, rank) as reader:
        plan = reader.read(step_id, slot, timeout_s=10.0)
        out.put((plan.step_id, plan.input_ids.tolist(), plan.block_table.tolist(),
                 plan.sampling["seed"].tolist()))
        del plan
        reader.consumed(step_id)


def test_reader_in_another_process_attaches_by_name_and_reads_the_plan(run_id):
    name = ring_name(run_id, 1)
    want = plan_for(41)
    with StepRing.create(name, num_slots=4, slot_bytes=SLOT_BYTES, num_readers=1) as writer:
        slot = writer.write(want, timeout_s=1.0)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        child = ctx.Process(target=_read_in_child, args=(name, 0, 41, slot, out))
        child.start()
        got = out.get(timeout=30)
        child.join(timeout=30)
        assert child.exitcode == 0
        assert got == (41, want.input_ids.tolist(), want.block_table.tolist(), want.sampling["seed"].tolist())
        assert writer.consumed_steps() == [41]
        writer.unlink()


def test_slot_is_reused_only_after_every_reader_consumed_it(run_id):
    name = ring_name(run_id, 0)
    writer = StepRing.create(name, num_slots=2, slot_bytes=SLOT_BYTES, num_readers=2)
    fast, slow = StepRing.attach(name, rank=0), StepRing.attach(name, rank=1)
    for step_id in (0, 1):
        slot = writer.write(plan_for(step_id), timeout_s=1.0)
        fast.read(step_id, slot, timeout_s=1.0)
        fast.consumed(step_id)

    seen_by_slow_reader = []
    consumed_at = []

    def slow_reader():
        time.sleep(0.2)
        # The writer is blocked on slot 0 by now; the slot must still hold step 0, intact.
        seen_by_slow_reader.append(slow.read(0, 0, timeout_s=1.0).input_ids.tolist())
        consumed_at.append(time.monotonic())
        slow.consumed(0)

    thread = threading.Thread(target=slow_reader)
    thread.start()
    slot = writer.write(plan_for(2), timeout_s=5.0)
    written_at = time.monotonic()
    thread.join()
    assert slot == 0
    assert seen_by_slow_reader == [plan_for(0).input_ids.tolist()]
    assert written_at >= consumed_at[0]
    assert_plans_equal(fast.read(2, 0, timeout_s=1.0), plan_for(2))
    for ring in (fast, slow, writer):
        ring.close()
    writer.unlink()


def test_write_timeout_names_the_stuck_rank_the_step_and_the_slot(run_id):
    name = ring_name(run_id, 0)
    with StepRing.create(name, num_slots=2, slot_bytes=SLOT_BYTES, num_readers=3) as writer:
        readers = [StepRing.attach(name, rank) for rank in range(3)]
        writer.write(plan_for(10), timeout_s=1.0)
        writer.write(plan_for(11), timeout_s=1.0)
        readers[0].consumed(11)
        readers[2].consumed(10)
        start = time.monotonic()
        with pytest.raises(RingTimeout, match=r"reader tp=1 did not consume step 10 \(slot 0\) within 0.2 s"):
            writer.write(plan_for(12), timeout_s=0.2)
        assert time.monotonic() - start < 2.0
        readers[1].consumed(10)
        assert writer.write(plan_for(12), timeout_s=1.0) == 0
        with pytest.raises(RingTimeout, match=r"readers tp=1, tp=2 did not consume step 11 \(slot 1\)"):
            writer.write(plan_for(13), timeout_s=0.05)
        for reader in readers:
            reader.close()
        writer.unlink()


def test_a_rank_inside_a_step_is_told_from_one_that_never_took_it(run_id):
    """The scheduler's watchdog on an overdue step: a rank that took it (its plan in hand, not yet
    consumed) is stuck inside it; one that did not take it never got that far."""
    from types import SimpleNamespace

    from procs.replica import Replica

    name = ring_name(run_id, 0)
    with StepRing.create(name, num_slots=2, slot_bytes=SLOT_BYTES, num_readers=2) as writer:
        readers = [StepRing.attach(name, rank) for rank in range(2)]
        assert writer.taken_steps() == [-1, -1]
        writer.write(plan_for(4), timeout_s=1.0)
        readers[0].read(4, 0, timeout_s=1.0)
        readers[0].took(4)
        assert writer.taken_steps() == [4, -1] and writer.consumed_steps() == [-1, -1]
        replica = SimpleNamespace(ring=writer, index=3, tp_size=2)
        replica.rank_names = lambda ranks=None: Replica.rank_names(replica, ranks)
        flight = SimpleNamespace(plan=plan_for(4))
        assert Replica.stuck_reason(replica, flight, 5.0) == (
            "executor dp=3 tp=1 did not take step 4 from the ring within 5 s")
        readers[1].took(4)
        readers[1].took(2)  # taken only moves forward
        assert writer.taken_steps() == [4, 4]
        assert Replica.stuck_reason(replica, flight, 5.0).startswith(
            "executor dp=3 tp=0, executor dp=3 tp=1 took step 4 but no result came within 5 s "
            "(stuck inside the step")
        with pytest.raises(RingError, match="the writer takes no steps"):
            writer.took(5)
        for reader in readers:
            reader.close()
        writer.unlink()


def test_read_of_another_step_raises_naming_the_step(run_id):
    name = ring_name(run_id, 0)
    with StepRing.create(name, num_slots=2, slot_bytes=SLOT_BYTES, num_readers=1) as writer:
        reader = StepRing.attach(name, rank=0)
        writer.write(plan_for(3), timeout_s=1.0)
        start = time.monotonic()
        with pytest.raises(RingError, match="expected step 2 in slot 0, it holds step 3"):
            reader.read(2, 0, timeout_s=5.0)
        assert time.monotonic() - start < 1.0  # a later step is a wrong announcement: no wait
        with pytest.raises(RingTimeout, match="waited 0.05 s for step 5 in slot 1, which holds nothing yet"):
            reader.read(5, 1, timeout_s=0.05)
        with pytest.raises(RingError, match="step 3 announced in slot 7, the ring has slots 0..1"):
            reader.read(3, 7, timeout_s=0.05)
        reader.close()
        writer.unlink()


def test_read_waits_for_a_header_the_doorbell_overtook(run_id):
    name = ring_name(run_id, 0)
    with StepRing.create(name, num_slots=2, slot_bytes=SLOT_BYTES, num_readers=1) as writer:
        reader = StepRing.attach(name, rank=0)
        got = []
        thread = threading.Thread(
            target=lambda: got.append(reader.read(0, 0, timeout_s=5.0).input_ids.copy())
        )
        thread.start()
        time.sleep(0.05)
        writer.write(plan_for(0), timeout_s=1.0)
        thread.join()
        np.testing.assert_array_equal(got[0], plan_for(0).input_ids)
        reader.close()
        writer.unlink()


def test_oversize_plan_raises_with_both_sizes_and_leaves_the_slot_alone(run_id):
    name = ring_name(run_id, 0)
    with StepRing.create(name, num_slots=2, slot_bytes=2048, num_readers=1) as writer:
        big = plan_for(0, num_tokens=300)
        need = packed_plan_nbytes(big.num_reqs, big.num_tokens, big.block_table.shape[1], 0)
        with pytest.raises(ValueError, match=f"step 0 packs to {need} bytes, a slot holds 2048"):
            writer.write(big, timeout_s=1.0)
        assert writer.write(plan_for(0), timeout_s=1.0) == 0  # the ring still works, from slot 0
        writer.unlink()


def test_step_ids_must_increase(run_id):
    name = ring_name(run_id, 0)
    with StepRing.create(name, num_slots=2, slot_bytes=SLOT_BYTES, num_readers=1) as writer:
        writer.write(plan_for(5), timeout_s=1.0)
        with pytest.raises(RingError, match="got step 5 after 5"):
            writer.write(plan_for(5), timeout_s=1.0)
        reader = StepRing.attach(name, rank=0)
        reader.consumed(5)
        with pytest.raises(RingError, match="reader tp=0 consumed step 4 after 5"):
            reader.consumed(4)
        reader.close()
        writer.unlink()


def test_attach_errors_name_the_ring_and_the_rank(run_id):
    name = ring_name(run_id, 0)
    with pytest.raises(FileNotFoundError, match=f"ring {name} does not exist"):
        StepRing.attach(name, rank=0)
    with StepRing.create(name, num_slots=2, slot_bytes=SLOT_BYTES, num_readers=2) as writer:
        with pytest.raises(ValueError, match="has readers tp=0..1, not tp=2"):
            StepRing.attach(name, rank=2)
        with pytest.raises(FileExistsError, match=f"ring {name} already exists"):
            StepRing.create(name, num_slots=2, slot_bytes=SLOT_BYTES, num_readers=2)
        writer.unlink()


def test_unlink_leaves_nothing_in_dev_shm_and_close_is_idempotent(run_id):
    name = ring_name(run_id, 0)
    writer = StepRing.create(name, num_slots=3, slot_bytes=SLOT_BYTES, num_readers=1)
    reader = StepRing.attach(name, rank=0)
    writer.write(plan_for(0), timeout_s=1.0)
    plan = reader.read(0, 0, timeout_s=1.0)
    assert shm_entries(name) == [name]
    reader.close()  # a plan still holds views: the mapping outlives the handle
    reader.close()
    assert plan.input_ids.tolist() == plan_for(0).input_ids.tolist()
    writer.close()
    writer.unlink()
    writer.unlink()
    assert shm_entries(name) == []
    with pytest.raises(RingError, match=f"ring {name} is closed"):
        writer.write(plan_for(1), timeout_s=1.0)


def _crash_after_writing(name: str) -> None:
    ring = StepRing.create(name, num_slots=2, slot_bytes=SLOT_BYTES, num_readers=1)
    ring.write(plan_for(0), timeout_s=1.0)
    os._exit(1)  # no close, no unlink: what a killed scheduler leaves behind


def test_cleanup_stale_removes_the_segments_of_a_crashed_run(run_id):
    prefix = run_prefix(run_id)
    ctx = mp.get_context("spawn")
    child = ctx.Process(target=_crash_after_writing, args=(ring_name(run_id, 0),))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 1
    with open(os.path.join(SHM_DIR, f"{prefix}kv-dp1"), "wb"):  # another leftover of the same run
        pass
    other_run = StepRing.create(ring_name(f"{run_id}x", 0), num_slots=1, slot_bytes=64, num_readers=1)

    assert shm_entries(prefix) == [f"{prefix}kv-dp1", f"{prefix}ring-dp0"]
    assert cleanup_stale(prefix) == [f"{prefix}kv-dp1", f"{prefix}ring-dp0"]
    assert shm_entries(prefix) == []
    assert shm_entries(other_run.name) == [other_run.name]  # only the crashed run's prefix goes
    assert cleanup_stale(prefix) == []
    other_run.close()
    other_run.unlink()


def test_register_with_cuda_is_a_noop_without_cuda(run_id):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine really registers; covered by the GPU tests")
    with StepRing.create(ring_name(run_id, 0), num_slots=1, slot_bytes=64, num_readers=1) as writer:
        assert writer.register_with_cuda() is False
        writer.unlink()


def _paced_reader(name: str, rank: int, num_steps: int, pause_every: int, queue) -> None:
    """Read every step in order, pausing now and then, and report a checksum of what it read."""
    ring = StepRing.attach(name, rank=rank)
    checksum = 0
    try:
        for step_id in range(num_steps):
            plan = ring.read(step_id, step_id % ring.num_slots, timeout_s=10.0)
            assert plan.step_id == step_id and plan.input_ids[0] == 100 + step_id
            checksum += int(plan.input_ids.sum())
            ring.consumed(step_id)
            if step_id % pause_every == 0:
                time.sleep(0.001)
        queue.put((rank, checksum))
    finally:
        ring.close()


def test_thousands_of_steps_reach_readers_of_different_speeds_intact(run_id):
    name = ring_name(run_id, 0)
    num_steps = 3000
    writer = StepRing.create(name, num_slots=4, slot_bytes=SLOT_BYTES, num_readers=2)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    readers = [ctx.Process(target=_paced_reader, args=(name, rank, num_steps, pause, queue))
               for rank, pause in ((0, 1000), (1, 50))]  # rank 1 naps twenty times as often
    for p in readers:
        p.start()
    expected = 0
    for step_id in range(num_steps):
        plan = plan_for(step_id)
        expected += int(plan.input_ids.sum())
        writer.write(plan, timeout_s=10.0)  # blocks on the slower reader, never overwrites it
    results = dict(queue.get(timeout=60) for _ in readers)
    for p in readers:
        p.join(10)
        assert p.exitcode == 0
    assert results == {0: expected, 1: expected}
    assert writer.consumed_steps() == [num_steps - 1, num_steps - 1]
    writer.close()
    writer.unlink()
    assert shm_entries(run_prefix(run_id)) == []
