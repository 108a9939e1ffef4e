"""The executor process: one GPU rank (or one CPU worker) of one replica.

It joins its replica's TP group (NCCL across cards, gloo on the CPU or when ranks share a card),
loads its shard, profiles memory, compiles the kernels and captures the decode graphs (rank 0 logs
each phase with its time, core/execution/startup_phases.py), reports its KV pages in the READY
handshake, then loops:

    wait for a doorbell -> read the plan from the ring -> launch it on the device -> reply (TP rank 0)

A started step replies once its device work is done. If the next plan arrives first (async
scheduling sends it early), that plan is started behind the running step before the older one
replies, so the GPU goes from one step to the next without waiting for the host.

It never decides anything. Every TP rank runs every step in the order the doorbell announces them,
which is what keeps the ranks in lockstep. An exception inside a step becomes a StepDone with the
error and the rank that raised it (any rank reports its own failure); the loop lives on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from ipc.channels import PushChannel, SubChannel
from ipc.codec import decode
from ipc.messages import Ping, Pong, StepDone, StepReady, Stop
from ipc.process_specs import ExecutorSpec, Ready
from ipc.step_frames import result_to_frames
from procs.child import become, parent_alive, run_actor
from procs.fault_injection import JOIN, fault_for, strike
from procs.plan_receiver import BadDoorbell, PlanReceiver, Step
from procs.problem_log import ProblemLog

if TYPE_CHECKING:  # torch loads in the executor process only, when it builds its runner
    from core.execution.runner import LaunchedStep

_IDLE_WAIT_S = 1.0


def run_executor(spec_bytes: bytes, ready_conn: Connection) -> None:
    """Process entry point (multiprocessing spawn target)."""
    spec: ExecutorSpec = decode(spec_bytes)
    log = become(f"cadence:executor dp={spec.replica} tp={spec.rank}")

    def start() -> Executor:
        executor = Executor(spec, _build_runner(spec), log)
        graphs = getattr(executor.runner, "graphs", None)
        log.info("ready: %d KV pages of %d tokens on %s; %s", executor.num_pages,
                 spec.config.cache.block_size, spec.device,
                 f"decode CUDA graphs up to batch {graphs.max_batch}" if graphs else "eager")
        return executor

    run_actor(ready_conn, Ready("executor", os.getpid(), spec.replica, spec.rank), log, start)


def _build_runner(spec: ExecutorSpec):
    import torch

    from core.execution.custom_all_reduce import DEFAULT_MAX_BYTES
    from core.execution.distributed import TPGroup, init_tp_group
    from core.execution.runner import ModelRunner
    from core.execution.startup_phases import StartupPhases

    if spec.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(spec.device))
    else:
        # Every executor of the machine shares its cores; more threads than that only thrash.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.config.parallel.world_size))
    tp_size = spec.config.parallel.tp_size
    fault = fault_for(spec.replica, spec.rank)
    if fault is not None and fault.at == JOIN:  # a drill: a rank that hangs, dies or fails before joining
        logging.getLogger(__name__).warning("fault drill: %s before joining the TP group", fault.action)
        strike(fault)
    custom_all_reduce_bytes = 0 if spec.config.parallel.disable_custom_all_reduce else DEFAULT_MAX_BYTES
    tp = TPGroup()
    if tp_size > 1:
        with StartupPhases(spec.rank == 0).phase(f"joining the TP group of {tp_size} ranks"):
            tp = init_tp_group(spec.rank, tp_size, spec.dist_init_method, spec.dist_backend, spec.device,
                               timeout_s=spec.dist_timeout_s, custom_all_reduce_bytes=custom_all_reduce_bytes)
    config = dataclasses.replace(spec.config, device=spec.device)
    return ModelRunner(config, tp=tp, show_progress=spec.rank == 0, memory_share=spec.kv_memory_share,
                       load_vocabulary=_vocabulary_loader(spec.tokenizer_path, config.model.vocab_size))


def _vocabulary_loader(tokenizer_path: str | None, width: int):
    """What rank 0 calls on the first structured output: the tokenizer's tokens (the sampling rank
    is the only one that masks)."""
    def load():
        from core.structured.token_masks import Vocabulary
        from core.tokenizer import load_tokenizer

        started = time.perf_counter()
        vocabulary = Vocabulary.of_tokenizer(load_tokenizer(tokenizer_path), width)
        logging.getLogger(__name__).info("structured outputs: the vocabulary's %d tokens indexed in %.1f s",
                                         len(vocabulary.sorted_bytes), time.perf_counter() - started)
        return vocabulary
    return load


# An executor of a TP replica whose step raised exits with this code (see Executor.step_failed).
TP_STEP_FAILED_EXIT_CODE = 70


@dataclass
class StartedStep:
    """A step handed to the runner whose result has not been sent."""

    step: Step
    handle: LaunchedStep | None  # None: it failed to launch (see error)
    error: str | None
    waited_ms: float | None  # the GPU's idle time before it, when it followed an idle GPU

    def ready(self) -> bool:
        return self.handle is None or self.handle.ready()


class Executor:
    def __init__(self, spec: ExecutorSpec, runner, log: logging.Logger) -> None:
        self.spec = spec
        self.runner = runner
        self.log = log
        # A doorbell message that does not decode cannot be answered: the step it announced (if it
        # was one) never runs here, and the scheduler's step timeout names this rank as stuck.
        self.problems = ProblemLog(log)
        self.name = f"executor dp={spec.replica} tp={spec.rank}"
        fault = fault_for(spec.replica, spec.rank)  # a drill: die at a chosen step
        self.fault = None if fault is None or fault.at == JOIN else fault
        if self.fault is not None:
            log.warning("fault drill armed: %s", self.fault)
        self._ppid = os.getppid()
        doorbell = SubChannel.connect(spec.doorbell, name=f"doorbell of replica {spec.replica}",
                                      types=(StepReady, Ping, Stop))
        self.plans = PlanReceiver(doorbell, spec.ring_name, spec.rank, spec.spin_s,
                                  register_with_cuda=spec.device.startswith("cuda"))
        self.results = PushChannel.connect(spec.results, name="results to the scheduler")
        self._replied_s: float | None = None  # when the last result went out
        self._idle_since: float | None = None  # when the GPU last ran dry with no plan queued

    @property
    def num_pages(self) -> int:
        return self.runner.num_pages

    def loop(self) -> None:
        started: StartedStep | None = None  # a step on the GPU whose result has not gone out yet
        while True:
            try:
                if started is None:
                    msg = self.plans.receive(_IDLE_WAIT_S)
                else:
                    msg = self.plans.receive_unless(started.ready)
                    if msg is None:  # the GPU finished before the next plan came: reply, then wait
                        self._idle_since = time.perf_counter()
                        self.reply(started)
                        started = None
                        continue
            except BadDoorbell as exc:
                self.problems.warning("bad doorbell message", str(exc))
                continue
            if msg is None:
                if not parent_alive(self._ppid):
                    self.log.warning("the launcher is gone; exiting")
                    return
            elif isinstance(msg, Stop):
                if started is not None:
                    self.reply(started)
                return
            elif isinstance(msg, Ping):
                self.results.send(Pong(self.spec.replica, self.spec.rank, msg.nonce))
            else:
                # The next step goes on the GPU behind the one running; then the older one replies.
                step = self.start_step(msg)
                if started is not None:
                    self.reply(started)
                started = step

    def start_step(self, step: Step) -> StartedStep:
        """Queue one step on the device; an exception becomes the step's error result."""
        now = time.perf_counter()
        waited_ms = None if self._idle_since is None else (now - self._idle_since) * 1e3
        self._idle_since = None
        try:
            if self.fault is not None and self.fault.fires(step.plan):
                self.log.warning("fault drill: %s at step %d", self.fault.action, step.step_id)
                self.fault, fault = None, self.fault  # once
                strike(fault, step.step_id)
            return StartedStep(step, self.runner.launch(step.plan), None, waited_ms)
        except Exception as exc:  # the step's requests fail with this message; the loop lives on
            return StartedStep(step, None, self.step_failed(step, exc), waited_ms)

    def step_failed(self, step: Step, exc: Exception) -> str:
        """The error a failed step reports. On one rank its requests fail and the loop goes on. A
        TP rank cannot go on: its peers may be waiting in a collective it never reached (or it
        failed in one because a peer died), so the group is out of lockstep for good. It exits, the
        launcher takes the replica down, and the replica's requests move to live ones."""
        self.log.exception("step %d failed", step.step_id)
        if self.spec.config.parallel.tp_size > 1:
            self.log.error("%s: a failed step leaves the TP group of replica %d out of lockstep; exiting "
                           "so that the replica is taken down and its requests move", self.name,
                           self.spec.replica)
            logging.shutdown()
            os._exit(TP_STEP_FAILED_EXIT_CODE)
        return f"{self.name}: {type(exc).__name__}: {exc}"

    def reply(self, started: StartedStep) -> None:
        """Wait for a started step and send its result: rank 0 always, any rank when it failed here
        (a TP rank > 0 otherwise only frees the plan's slot).

        The timings carry `wait`: milliseconds the GPU sat idle with nothing queued before this step
        (from the reply that left it idle to this launch); the scheduler counts it only between
        back-to-back steps, when it had work for this replica all along."""
        step, error = started.step, started.error
        result = None
        if error is None:
            try:
                result = self.runner.finish(started.handle)
            except Exception as exc:
                error = self.step_failed(step, exc)
        self.plans.done(step)  # the device has copied the plan's host data
        now = time.perf_counter()
        if error is not None:
            self.results.send(StepDone(self.spec.replica, self.spec.rank, step.step_id, error=error))
        elif result is not None:
            # Busy time without overlap: from this launch, or from the previous reply if later.
            start = max(started.handle.start_s, self._replied_s or 0.0)
            result.timings_ms["execute"] = (now - start) * 1e3
            if started.waited_ms is not None:
                result.timings_ms["wait"] = started.waited_ms
            done, payload = result_to_frames(result, self.spec.rank)
            self.results.send(done, frames=payload)
        self._replied_s = now

    def close(self) -> None:
        self.plans.close()
        self.plans.doorbell.close()
        self.results.close()
        if self.spec.config.parallel.tp_size > 1:
            import torch

            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
