"""The executor process: one GPU rank (or one CPU worker) of one replica.

It loads its shard, joins its replica's TP group (NCCL across cards, gloo on the CPU or when ranks
share a card), profiles memory, reports its KV pages in the READY handshake, then loops:

    wait for a doorbell -> read the plan from the ring -> run the ModelRunner -> reply (TP rank 0)

It never decides anything. Every TP rank runs every step in the order the doorbell announces them,
which is what keeps the ranks in lockstep. An exception inside a step becomes a StepDone with the
error and the rank that raised it (any rank reports its own failure); the loop lives on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from multiprocessing.connection import Connection

import numpy as np

from core.plan import StepResult
from ipc.channels import PushChannel, SubChannel
from ipc.codec import decode
from procs.child import become, parent_alive, run_actor
from procs.messages import ExecutorSpec, Ping, Pong, Ready, StepDone, StepReady, Stop
from procs.plan_receiver import BadDoorbell, PlanReceiver, Step
from procs.step_frames import result_to_frames

_IDLE_WAIT_S = 1.0


def run_executor(spec_bytes: bytes, ready_conn: Connection) -> None:
    """Process entry point (multiprocessing spawn target)."""
    spec: ExecutorSpec = decode(spec_bytes)
    log = become(f"cadence:executor dp={spec.replica} tp={spec.rank}")

    def start() -> Executor:
        executor = Executor(spec, _build_runner(spec), log)
        log.info("ready: %d KV pages of %d tokens on %s", executor.num_pages, spec.config.cache.block_size,
                 spec.device)
        return executor

    run_actor(ready_conn, Ready("executor", os.getpid(), spec.replica, spec.rank), log, start)


def _build_runner(spec: ExecutorSpec):
    import torch

    from core.distributed import TPGroup, init_tp_group
    from core.runner import ModelRunner

    if spec.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(spec.device))
    else:
        # Every executor of the machine shares its cores; more threads than that only thrash.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.config.parallel.world_size))
    tp_size = spec.config.parallel.tp_size
    tp = TPGroup() if tp_size == 1 else init_tp_group(
        spec.rank, tp_size, spec.dist_init_method, spec.dist_backend, timeout_s=spec.dist_timeout_s)
    config = dataclasses.replace(spec.config, device=spec.device)
    return ModelRunner(config, tp=tp, show_progress=spec.rank == 0, memory_share=spec.kv_memory_share)


class Executor:
    def __init__(self, spec: ExecutorSpec, runner, log: logging.Logger) -> None:
        self.spec = spec
        self.runner = runner
        self.log = log
        self.name = f"executor dp={spec.replica} tp={spec.rank}"
        self._ppid = os.getppid()
        doorbell = SubChannel.connect(spec.doorbell, name=f"doorbell of replica {spec.replica}",
                                      types=(StepReady, Ping, Stop))
        self.plans = PlanReceiver(doorbell, spec.ring_name, spec.rank, spec.spin_s,
                                  register_with_cuda=spec.device.startswith("cuda"))
        self.results = PushChannel.connect(spec.results, name="results to the scheduler")
        self._replied_s: float | None = None  # when the last result went out

    @property
    def num_pages(self) -> int:
        return self.runner.num_pages

    def loop(self) -> None:
        while True:
            try:
                msg = self.plans.receive(_IDLE_WAIT_S)
            except BadDoorbell as exc:
                self.log.warning("ignored a bad doorbell message: %s", exc)
                continue
            if msg is None:
                if not parent_alive(self._ppid):
                    self.log.warning("the launcher is gone; exiting")
                    return
            elif isinstance(msg, Stop):
                return
            elif isinstance(msg, Ping):
                self.results.send(Pong(self.spec.replica, self.spec.rank, msg.nonce))
            else:
                self.step(msg)

    def step(self, step: Step) -> None:
        """Run one step and reply: rank 0 always, any rank when the step failed on it.

        The reply's timings carry `wait`: milliseconds from this executor's previous reply to this
        plan in hand, during which its GPU had nothing queued. The scheduler counts it only between
        back-to-back steps (when it had work for this replica all along)."""
        waited_ms = None if self._replied_s is None else (time.perf_counter() - self._replied_s) * 1e3
        try:
            result = self.runner.execute(step.plan)
        except Exception as exc:  # the step's requests fail with this message; the loop lives on
            self.log.exception("step %d failed", step.step_id)
            result = StepResult(step_id=step.step_id, replica=self.spec.replica,
                                sampled_token_ids=np.zeros(0, np.int32),
                                error=f"{self.name}: {type(exc).__name__}: {exc}")
        finally:
            # The ranks sync in the forward's collectives, so the plan's host data has been copied.
            self.plans.done(step)
        if result is None:
            return
        if result.error is not None:
            self.results.send(StepDone(self.spec.replica, self.spec.rank, step.step_id, error=result.error))
            self._replied_s = time.perf_counter()
            return
        if waited_ms is not None:
            result.timings_ms["wait"] = waited_ms
        done, payload = result_to_frames(result, self.spec.rank)
        self.results.send(done, frames=payload)
        self._replied_s = time.perf_counter()

    def close(self) -> None:
        self.plans.close()
        self.plans.doorbell.close()
        self.results.close()
        if self.spec.config.parallel.tp_size > 1:
            import torch

            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
