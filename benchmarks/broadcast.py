"""Plan broadcast latency: from the scheduler starting to write a step to every TP reader holding it.

    python -m benchmarks.broadcast --readers 2 --steps 5000 --batch 256

The writer packs a decode-shaped plan into the shared-memory ring and publishes the doorbell; each
reader process (as an executor does) waits on the doorbell, reads the slot as views and marks the
step consumed; the writer spins on the consumed words and records the time until the last reader
got there. That is the whole hand-off an executor waits for between two steps, minus the forward.
The readers are idle between steps here, so with --spin-us 0 every step pays a socket wake-up;
a spinning reader (the default where cores allow) sees the slot header change instead.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time
import uuid

import numpy as np

from core.plan import StepPlan
from core.sampling_params import sampling_rows
from ipc.channels import PubChannel, PullChannel, PushChannel, SubChannel
from ipc.messages import Ping, Pong, StepReady, Stop
from ipc.shm_ring import StepRing, cleanup_stale, ring_name, run_prefix
from procs.launcher import SPIN_S
from procs.plan_receiver import PlanReceiver


def decode_plan(step_id: int, batch: int, pages_per_request: int, block_size: int = 16) -> StepPlan:
    """A decode step of `batch` requests, each `pages_per_request` pages deep."""
    seq_lens = np.full(batch, pages_per_request * block_size - 3, np.int32)
    return StepPlan(
        step_id=step_id, replica=0, query_start=np.arange(batch + 1, dtype=np.int32), seq_lens=seq_lens,
        block_table=np.arange(batch * pages_per_request, dtype=np.int32).reshape(batch, -1),
        logits_index=np.arange(batch, dtype=np.int32), sampling=sampling_rows(batch, seed=np.arange(batch)),
        output_pos=np.full(batch, 7, np.int32), input_ids=np.arange(batch, dtype=np.int32) + step_id,
        positions=seq_lens - 1, kv_index=np.arange(batch, dtype=np.int64),
    )


def _reader(name: str, rank: int, doorbell: str, replies: str, spin_s: float) -> None:
    """An executor's receive loop (the same PlanReceiver), with no forward."""
    sub = SubChannel.connect(doorbell, name="doorbell", types=(StepReady, Ping, Stop))
    plans = PlanReceiver(sub, name, rank, spin_s)
    push = PushChannel.connect(replies, name="replies")
    while True:
        msg = plans.receive(10.0)
        if isinstance(msg, Stop) or msg is None:
            break
        if isinstance(msg, Ping):
            push.send(Pong(0, rank, msg.nonce))
            continue
        _ = int(msg.plan.input_ids[0])  # touch the payload as an executor's copy would
        plans.done(msg)
    plans.close()
    sub.close()
    push.close()


def measure(num_readers: int, num_steps: int, batch: int, pages_per_request: int,
            spin_s: float) -> dict:
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    name = ring_name(run_id, 0)
    tmp = tempfile.mkdtemp(prefix="cadence-bench-")
    doorbell_address, replies_address = f"ipc://{tmp}/doorbell", f"ipc://{tmp}/replies"
    plans = [decode_plan(i, batch, pages_per_request) for i in range(8)]
    slot_bytes = 2 * max(p.block_table.nbytes for p in plans) + 64 * 1024
    ring = StepRing.create(name, 4, slot_bytes, num_readers)
    doorbell = PubChannel.bind(doorbell_address, name="doorbell")
    replies = PullChannel.bind(replies_address, name="replies")
    ctx = mp.get_context("spawn")
    readers = [ctx.Process(target=_reader, args=(name, r, doorbell_address, replies_address, spin_s))
               for r in range(num_readers)]
    for p in readers:
        p.start()
    try:
        answered, nonce = set(), 0
        while len(answered) < num_readers:
            nonce += 1
            doorbell.send(Ping(0, nonce))
            while (pong := replies.recv(0.05)) is not None:
                answered.add(pong.rank)
        consumed = ring._consumed  # the readers' words, read directly as the writer's wait does
        latencies_us = np.empty(num_steps)
        start = time.perf_counter()
        for step_id in range(num_steps):
            template = plans[step_id % len(plans)]
            plan = StepPlan(**{**template.__dict__, "step_id": step_id})
            t0 = time.perf_counter()
            slot = ring.write(plan, 5.0)
            doorbell.send(StepReady(step_id, slot))
            while consumed.min() < step_id:
                pass
            latencies_us[step_id] = (time.perf_counter() - t0) * 1e6
        elapsed = time.perf_counter() - start
    finally:
        doorbell.send(Stop())
        for p in readers:
            p.join(10)
        doorbell.close()
        replies.close()
        ring.close()
        ring.unlink()
        cleanup_stale(run_prefix(run_id))
    warm = latencies_us[min(100, num_steps // 10):]
    return {
        "readers": num_readers, "spin_us": spin_s * 1e6, "steps": num_steps, "batch": batch,
        "pages_per_request": pages_per_request,
        "plan_bytes": int(ring.slot_bytes), "cpu_count": os.cpu_count(),
        "median_us": float(np.median(warm)), "p90_us": float(np.percentile(warm, 90)),
        "p99_us": float(np.percentile(warm, 99)), "max_us": float(warm.max()),
        "steps_per_s": num_steps / elapsed,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.broadcast", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readers", type=int, default=2, help="TP ranks reading each plan (default 2)")
    parser.add_argument("--steps", type=int, default=5000, help="plans to broadcast (default 5000)")
    parser.add_argument("--batch", type=int, default=256, help="requests per decode plan (default 256)")
    parser.add_argument("--pages-per-request", type=int, default=128,
                        help="block-table width: 128 pages of 16 = 2,048-token contexts (default)")
    parser.add_argument("--spin-us", type=float, default=SPIN_S * 1e6,
                        help=f"readers watch the ring this long before blocking (default {SPIN_S * 1e6:g})")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    result = measure(args.readers, args.steps, args.batch, args.pages_per_request, args.spin_us * 1e-6)
    print(f"{result['readers']} readers, spin {args.spin_us:g} us, batch {result['batch']}: "
          f"median {result['median_us']:.1f} us, "
          f"p99 {result['p99_us']:.1f} us, {result['steps_per_s']:.0f} steps/s (no forward)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
