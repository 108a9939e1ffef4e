"""The executor's loop, with a fake runner: doorbell in, StepDone out, garbage and failures survived."""

from __future__ import annotations

import logging
import threading

import numpy as np
from plans import Chunk, make_plan
from system_client import tiny_config

from core.plan import StepResult, pack_plan, packed_plan_nbytes
from ipc.channels import PubChannel, PullChannel
from procs.executor_proc import Executor
from procs.messages import ExecutorSpec, Ping, Pong, StepDone, StepReady, Stop
from procs.step_frames import result_from_frames


class FakeRunner:
    """Samples token 1000 + row; raises for a plan whose first input id is 666."""

    def execute(self, plan):
        if plan.input_ids[0] == 666:
            raise RuntimeError("the fake runner was told to fail")
        return StepResult(plan.step_id, plan.replica, np.arange(plan.num_reqs, dtype=np.int32) + 1000)


def _frame(plan) -> bytearray:
    buf = bytearray(packed_plan_nbytes(plan.num_reqs, plan.num_tokens, plan.block_table.shape[1],
                                       len(plan.history_ids)))
    pack_plan(plan, buf)
    return buf


def test_executor_loop_answers_steps_reports_failures_and_survives_garbage(tmp_path):
    doorbell_address, results_address = f"ipc://{tmp_path}/doorbell", f"ipc://{tmp_path}/results"
    doorbell = PubChannel.bind(doorbell_address, name="test doorbell")
    results = PullChannel.bind(results_address, name="test results")
    spec = ExecutorSpec(tiny_config(), 0, 0, "cpu", doorbell_address, results_address, "unused-ring",
                        "", "gloo", 1.0)
    executor = Executor(spec, FakeRunner(), logging.getLogger("test"))
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
    finally:
        doorbell.send(Stop())
        thread.join(10)
        executor.close()
        doorbell.close()
        results.close()
    assert not thread.is_alive()
