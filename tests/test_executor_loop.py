"""The executor's loop, with a fake runner: doorbell in, StepDone out, garbage and failures survived."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import numpy as np
from plans import Chunk, make_plan
from system_client import tiny_config

from core.plan import StepResult
from ipc.channels import PubChannel, PullChannel
from ipc.messages import Ping, Pong, StepDone, StepReady, Stop
from ipc.plan_layout import pack_plan, packed_plan_nbytes
from ipc.process_specs import ExecutorSpec
from ipc.step_frames import result_from_frames
from procs.executor_proc import Executor


class FakeHandle:
    def __init__(self, plan, ready_at: float) -> None:
        self.plan, self.start_s, self.ready_at = plan, time.perf_counter(), ready_at

    def ready(self) -> bool:
        return time.perf_counter() >= self.ready_at


class FakeRunner:
    """Samples token 1000 + row; raises for a plan whose first input id is 666.

    Like a GPU, a launched step is done `step_s` after it (or the step before it) started."""

    def __init__(self, step_s: float = 0.0) -> None:
        self.step_s = step_s
        self.events: list[tuple[str, int]] = []  # ("launch" | "finish", step id), in order
        self._busy_until = 0.0

    def launch(self, plan):
        if plan.input_ids[0] == 666:
            raise RuntimeError("the fake runner was told to fail")
        self.events.append(("launch", plan.step_id))
        self._busy_until = max(self._busy_until, time.perf_counter()) + self.step_s
        return FakeHandle(plan, self._busy_until)

    def finish(self, handle):
        while not handle.ready():
            time.sleep(0.001)
        self.events.append(("finish", handle.plan.step_id))
        plan = handle.plan
        return StepResult(plan.step_id, plan.replica, np.arange(plan.num_reqs, dtype=np.int32) + 1000,
                          timings_ms={"execute": 1.0})


def _frame(plan) -> bytearray:
    buf = bytearray(packed_plan_nbytes(plan.num_reqs, plan.num_tokens, plan.block_table.shape[1],
                                       len(plan.history_ids)))
    pack_plan(plan, buf)
    return buf


@contextlib.contextmanager
def running_executor(tmp_path, runner: FakeRunner):
    """An Executor looping in a thread on a test doorbell; yields (doorbell, results) once it answers."""
    doorbell_address, results_address = f"ipc://{tmp_path}/doorbell", f"ipc://{tmp_path}/results"
    doorbell = PubChannel.bind(doorbell_address, name="test doorbell")
    results = PullChannel.bind(results_address, name="test results")
    spec = ExecutorSpec(tiny_config(), 0, 0, "cpu", doorbell_address, results_address, "unused-ring",
                        "", "gloo", 1.0)
    executor = Executor(spec, runner, logging.getLogger("test"))
    thread = threading.Thread(target=executor.loop)
    thread.start()
    try:
        pong = None
        for nonce in range(100):  # until the subscription is live
            doorbell.send(Ping(0, nonce))
            pong = results.recv(0.05)
            if pong is not None:
                break
        assert isinstance(pong, Pong) and (pong.replica, pong.rank) == (0, 0)
        while results.recv(0.1) is not None:
            pass
        yield doorbell, results
    finally:
        doorbell.send(Stop())
        thread.join(10)
        executor.close()
        doorbell.close()
        results.close()
    assert not thread.is_alive()


def test_executor_loop_answers_steps_reports_failures_and_survives_garbage(tmp_path):
    with running_executor(tmp_path, FakeRunner()) as (doorbell, results):
        # Garbage, then a valid envelope of a type the doorbell does not carry.
        doorbell._socket.send_multipart([b"", b"\xff garbage"])
        wrong_type = b'{"type": "Pong", "body": {"replica": 0, "rank": 0, "nonce": 1}}'
        doorbell._socket.send_multipart([b"", wrong_type])

        plan = make_plan([Chunk([5, 6, 7], 0, [3]), Chunk([9], 4, [8])], block_size=16, step_id=7)
        doorbell.send(StepReady(7, -1), frames=[_frame(plan)])
        delivery = results.recv_with_frames(10)
        done = delivery.message
        assert isinstance(done, StepDone) and done.step_id == 7 and done.error is None
        result = result_from_frames(done, delivery.frames, plan.num_reqs)
        assert result.sampled_token_ids.tolist() == [1000, 1001]

        failing = make_plan([Chunk([666], 0, [1])], block_size=16, step_id=8)
        doorbell.send(StepReady(8, -1), frames=[_frame(failing)])
        failed = results.expect(10)
        assert failed.step_id == 8
        assert failed.error == "executor dp=0 tp=0: RuntimeError: the fake runner was told to fail"

        doorbell.send(StepReady(9, -1), frames=[_frame(make_plan([Chunk([1], 0, [1])], 16, step_id=9))])
        assert results.expect(10).error is None  # still serving after the failure


def test_a_plan_that_arrives_while_the_gpu_runs_is_launched_before_the_older_step_replies(tmp_path):
    runner = FakeRunner(step_s=0.3)
    with running_executor(tmp_path, runner) as (doorbell, results):
        for step_id in (0, 1):  # the second plan arrives while the first step runs
            plan = make_plan([Chunk([5, 6], 0, [3])], block_size=16, step_id=step_id)
            doorbell.send(StepReady(step_id, -1), frames=[_frame(plan)])
        first, second = results.expect(10), results.expect(10)
        assert (first.step_id, second.step_id) == (0, 1) and first.error is None and second.error is None
        # step 1 went to the GPU before step 0's result came back: no gap between them
        assert runner.events == [("launch", 0), ("launch", 1), ("finish", 0), ("finish", 1)]
        assert second.timings_ms.get("wait", 0.0) == 0.0
        # a step that follows an idle GPU reports how long the GPU waited for it
        time.sleep(0.2)
        doorbell.send(StepReady(2, -1), frames=[_frame(make_plan([Chunk([1], 0, [1])], 16, step_id=2))])
        third = results.expect(10)
        assert third.step_id == 2 and third.timings_ms["wait"] >= 150
