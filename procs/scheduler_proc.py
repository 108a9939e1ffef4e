"""The scheduler process: the DP router and one continuous-batching scheduler per replica.

    receive (requests, aborts, notices) -> collect (step results) -> send_plans (plan, ring, doorbell)
    -> emit (outputs to the tokenizer) -> watch (deadlines, status)

Each replica has its own Scheduler (block pool, radix tree), its own shared-memory ring and its
own doorbell; its TP ranks read the same slot and run the same step. Replicas step independently:
up to two steps in flight per replica with async scheduling (else one; the second planned shortly
before the first is expected to end, core/scheduling/plan_ahead.py), results back in order,
nothing shared between replicas, no barrier. A replica whose executor dies (the launcher sends
ReplicaDown), or whose step or held ring slot outlives `step_timeout_s` (procs/replica.py), is
taken down; its requests move to live replicas and are recomputed there, as after a preemption,
so their streams simply continue. With no live replica left, every request ends with an error
that says why.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from multiprocessing.connection import Connection

from core.plan import StepPlan
from core.scheduling.dp_router import DPRouter
from core.scheduling.request import Request, TokenDelta
from core.scheduling.scheduler import RequestRejectedError, SchedulerError
from ipc.channels import BadFrame, PullChannel, PushChannel, wait_readable
from ipc.codec import decode
from ipc.messages import (
    AbortRequest,
    Admitted,
    CacheFlushed,
    FlushCache,
    Ping,
    Pong,
    Rejected,
    ReplicaDown,
    SchedulerStatus,
    Shutdown,
    StepDone,
    StepReady,
    Stop,
    TokenDeltas,
    TokenizedRequest,
)
from ipc.plan_layout import pack_plan, plan_nbytes
from ipc.process_specs import Ready, SchedulerSpec
from ipc.shm_ring import RingError, cleanup_stale, run_prefix
from ipc.step_frames import result_from_frames
from procs.cache_flush import flush_caches
from procs.child import become, parent_alive, run_actor
from procs.problem_log import ProblemLog
from procs.replica import InFlight, Replica
from procs.step_trace import StepTrace

_STATUS_EVERY_S = 0.2
_IDLE_WAIT_S = 0.2
_PING_EVERY_S = 0.1
_HANDSHAKE_TIMEOUT_S = 60.0
# send_plans() plans a replica only when its ring's next slot is free, so a write never waits in
# practice; this bounds it should a reader fall behind in between.
_RING_WRITE_TIMEOUT_S = 1.0
_RECEIVE_BUDGET_S = 0.005


def run_scheduler(spec_bytes: bytes, ready_conn: Connection) -> None:
    """Process entry point (multiprocessing spawn target)."""
    spec: SchedulerSpec = decode(spec_bytes)
    log = become("cadence:scheduler")

    def start() -> SchedulerProcess:
        process = SchedulerProcess(spec, log)
        try:
            process.handshake(_HANDSHAKE_TIMEOUT_S)
        except BaseException:
            process.close()
            raise
        return process

    run_actor(ready_conn, Ready("scheduler", os.getpid()), log, start)


class SchedulerProcess:
    def __init__(self, spec: SchedulerSpec, log: logging.Logger) -> None:
        self.spec = spec
        self.log = log
        self.step_timeout_s = spec.step_timeout_s
        self._ppid = os.getppid()
        cleanup_stale(run_prefix(spec.run_id))
        self.inputs = PullChannel.bind(spec.inputs, name="scheduler inputs",
                                       types=(TokenizedRequest, AbortRequest, FlushCache, ReplicaDown,
                                              Shutdown))
        self.results = PullChannel.bind(spec.results, name="executor results", types=(StepDone, Pong))
        self.outputs = PushChannel.connect(spec.outputs, name="outputs to the tokenizer")
        self.replicas: list[Replica] = []
        for index, num_pages in enumerate(spec.num_pages):
            self.replicas.append(Replica(index, spec, num_pages))
        self.router = DPRouter(len(self.replicas), spec.config.cache.block_size)
        self.trace = StepTrace(log)
        self.problems = ProblemLog(log)
        self._pending: list[TokenDelta] = []  # outputs to emit this iteration
        self._rejected: list[Rejected] = []
        self._admitted: list[str] = []  # placed this iteration, and asked to hear of it
        self._stopping = False
        self._last_status_s = 0.0

    # --- startup --------------------------------------------------------------------------------

    def handshake(self, timeout_s: float) -> None:
        """Ping every replica's doorbell until each TP rank answered: its subscription is live."""
        waiting = {(r.index, rank) for r in self.replicas for rank in range(r.tp_size)}
        deadline = time.monotonic() + timeout_s
        nonce = 0
        while waiting:
            if time.monotonic() > deadline:
                who = ", ".join(f"executor dp={d} tp={t}" for d, t in sorted(waiting))
                raise TimeoutError(f"{who} did not answer the scheduler's ping within {timeout_s:g} s")
            nonce += 1
            for replica in self.replicas:
                replica.doorbell.send(Ping(replica.index, nonce))
            until = time.monotonic() + _PING_EVERY_S
            while (left := until - time.monotonic()) > 0:
                try:
                    msg = self.results.recv(left)
                except BadFrame as exc:
                    self.problems.warning("bad message during the handshake", str(exc))
                    continue
                if isinstance(msg, Pong):
                    waiting.discard((msg.replica, msg.rank))

    # --- the loop -------------------------------------------------------------------------------

    def loop(self) -> None:
        while not self._stopping:
            self.wait()
            self.receive()
            self.collect()
            self.send_plans()
            self.emit()
            self.watch()

    def wait(self) -> None:
        """Until a message comes, or a replica has a step to plan: at once if its device is idle,
        when its PlanAhead says if one step runs and a second may follow (async scheduling)."""
        timeout = _IDLE_WAIT_S
        now = time.monotonic()
        for r in self.replicas:
            if not (r.alive and r.scheduler.has_unfinished()):
                continue
            if not r.in_flight:
                timeout = 0.0
            elif len(r.in_flight) < r.scheduler.max_steps_in_flight:
                timeout = min(timeout, r.plan_ahead.seconds_until_plan(now))
        wait_readable([self.inputs, self.results], timeout)

    def receive(self) -> None:
        """Take the requests and notices that came in, for at most _RECEIVE_BUDGET_S: a burst of
        arrivals must not keep the results and the next launch waiting (the rest is taken next turn)."""
        deadline = time.monotonic() + _RECEIVE_BUDGET_S
        while time.monotonic() < deadline and (msg := self._recv(self.inputs)) is not None:
            if isinstance(msg, TokenizedRequest):
                self.add_request(msg)
            elif isinstance(msg, AbortRequest):
                self.abort(msg.request_id)
            elif isinstance(msg, FlushCache):
                self.outputs.send(flush_caches(self.replicas, msg.query_id, self.log))
            elif isinstance(msg, ReplicaDown):
                self.take_down(msg.replica, msg.reason)
            elif isinstance(msg, Shutdown):
                self.log.info("shutting down: %s", msg.reason)
                self._stopping = True
                return

    def collect(self) -> None:
        while (delivery := self._recv(self.results, with_frames=True)) is not None:
            done = delivery.message
            if isinstance(done, StepDone):
                self.finish_step(done, delivery.frames)

    def send_plans(self) -> None:
        for replica in self.replicas:
            while replica.alive and len(replica.in_flight) < replica.scheduler.max_steps_in_flight:
                if not replica.plan_ahead.may_plan(time.monotonic(), len(replica.in_flight)):
                    break  # too early to freeze the next step's batch
                if not replica.ring_free(time.monotonic()):
                    break  # a rank still holds the slot: never block the loop (watch() times it)
                plan = replica.scheduler.schedule()
                if plan is None:
                    if not replica.in_flight:
                        self._pending.extend(replica.scheduler.drain_outputs())
                    else:
                        replica.plan_ahead.nothing_to_plan()
                    break
                try:
                    self.broadcast(replica, plan)
                except (RingError, ValueError) as exc:
                    self.take_down(replica.index, f"replica {replica.index}: cannot hand step "
                                                  f"{plan.step_id} to {replica.rank_names()}: {exc}")

    def broadcast(self, replica: Replica, plan: StepPlan) -> None:
        """Put the plan where every TP rank reads it and ring their doorbell once."""
        nbytes = plan_nbytes(plan)
        if nbytes <= replica.ring.slot_bytes:
            slot = replica.ring.write(plan, _RING_WRITE_TIMEOUT_S)
            replica.doorbell.send(StepReady(plan.step_id, slot))
        else:  # a rare oversized plan (long penalty histories, many biases) travels as a frame instead
            frame = bytearray(nbytes)
            pack_plan(plan, frame)
            replica.doorbell.send(StepReady(plan.step_id, -1), frames=[frame])
        sent_s = time.monotonic()
        self.trace.sent(replica.index, plan, sent_s, len(replica.in_flight), replica.scheduler)
        replica.plan_ahead.step_sent(sent_s, plan.num_tokens, len(replica.in_flight))
        replica.in_flight.append(InFlight(plan, sent_s, back_to_back=replica.has_work))

    def emit(self) -> None:
        for rejected in self._rejected:
            self.outputs.send(rejected)
        self._rejected.clear()
        if self._admitted:  # after send_plans: the step that prefills them is on its way first
            self.outputs.send(Admitted(self._admitted))
            self._admitted = []
        if self._pending:
            for out in self._pending:
                if out.finished:
                    self.router.release(out.request_id)
            self.outputs.send(TokenDeltas(self._pending))
            self._pending = []

    def watch(self) -> None:
        now = time.monotonic()
        for replica in self.replicas:
            flight = replica.overdue_step(now, self.step_timeout_s)
            reason = (replica.stuck_reason(flight, self.step_timeout_s) if flight is not None
                      else replica.ring_stuck_reason(now, self.step_timeout_s))
            if reason is not None:
                self.take_down(replica.index, reason)
                killed = replica.kill_executors()
                self.log.error("replica %d: killed its executors (pids %s) so their memory comes back",
                               replica.index, killed)
        if now - self._last_status_s >= _STATUS_EVERY_S:
            self.problems.flush()
            self.send_status()
            if not parent_alive(self._ppid):
                self.log.warning("the launcher is gone; exiting")
                self._stopping = True

    def send_status(self) -> None:
        """Tell the tokenizer which replicas serve (what /health and /metrics answer from)."""
        self._last_status_s = time.monotonic()
        serving = any(r.alive for r in self.replicas)
        self.outputs.send(SchedulerStatus(serving, [r.info(self.router.load_tokens[r.index])
                                                    for r in self.replicas]))

    # --- requests -------------------------------------------------------------------------------

    def add_request(self, msg: TokenizedRequest) -> None:
        request = Request(msg.request_id, msg.prompt_token_ids, msg.params, arrival_s=msg.arrival_s)
        if not self._place(request, new=True):
            self._rejected.append(Rejected(msg.request_id, self._no_replica_message(), status=503))
        elif msg.notify_admitted and self.router.replica_of(msg.request_id) is not None:
            self._admitted.append(msg.request_id)

    def _place(self, request: Request, new: bool) -> bool:
        """Route a request to a live replica; False when none is alive. Rejections are reported."""
        live = [r.index for r in self.replicas if r.alive]
        prompt = request.all_token_ids
        # An adopted request has generated some of its tokens already: only the rest is work.
        remaining = request.sampling_params.max_tokens - request.num_output_tokens
        route = self.router.pick(live, prompt, remaining,
                                 lambda i: self.replicas[i].scheduler.cached_prefix_len(prompt))
        if route is None:
            return False
        scheduler = self.replicas[route.replica].scheduler
        try:
            if new:
                scheduler.add_request(request)
            else:
                scheduler.adopt(request)
        except (RequestRejectedError, SchedulerError) as exc:
            self._rejected.append(Rejected(request.request_id, str(exc)))
            return True
        self.router.assign(request.request_id, route)
        self.trace.arrived(request.request_id, route.replica, len(prompt), route.cached_len)
        self.replicas[route.replica].plan_ahead.work_arrived()
        return True

    def abort(self, request_id: str) -> None:
        replica_index = self.router.replica_of(request_id)
        if replica_index is None:
            return  # finished already, or never admitted: nothing holds it
        replica = self.replicas[replica_index]
        if replica.scheduler.abort_request(request_id) and not replica.in_flight:
            self._pending.extend(replica.scheduler.drain_outputs())

    def finish_step(self, done: StepDone, frames: tuple[memoryview, ...]) -> None:
        replica = self.replicas[done.replica] if 0 <= done.replica < len(self.replicas) else None
        flight = replica.in_flight[0] if replica is not None and replica.in_flight else None
        if replica is None or flight is None or flight.plan.step_id != done.step_id:
            if replica is not None and not replica.alive:
                return  # a late result of a replica taken down: its requests are elsewhere now
            self.problems.warning("result of a step not in flight", (
                f"step {done.step_id} of replica {done.replica} from tp={done.rank}, but the oldest step "
                f"in flight there is {flight.plan.step_id if flight else None}"))
            return
        plan = flight.plan
        try:
            result = result_from_frames(done, frames, plan.num_reqs)
        except ValueError as exc:
            self.take_down(replica.index, f"replica {replica.index}: bad result: {exc}")
            return
        replica.in_flight.popleft()
        replica.record_timings(flight, result.timings_ms)
        execute_ms = result.timings_ms.get("execute")
        self.trace.done(replica.index, plan.step_id, execute_ms)
        replica.plan_ahead.step_done(time.monotonic(), plan.num_tokens,
                                     None if execute_ms is None else execute_ms / 1e3,
                                     replica.in_flight[0].plan.num_tokens if replica.in_flight else None)
        self._pending.extend(replica.scheduler.update(plan, result))
        replica.has_work = replica.scheduler.has_unfinished()

    # --- faults ---------------------------------------------------------------------------------

    def take_down(self, index: int, reason: str) -> None:
        """Mark a replica dead and move its requests to live replicas (or fail them)."""
        replica = self.replicas[index]
        if not replica.alive:
            return
        self.log.error("replica %d is down: %s", index, reason)
        replica.alive = False
        replica.down_reason = reason
        self.router.forget_replica(index)
        replica.in_flight.clear()
        self._pending.extend(replica.scheduler.drain_outputs())
        orphans = replica.scheduler.evacuate()
        for request in orphans:
            self.router.release(request.request_id)
            if not self._place(request, new=False):
                self._pending.append(TokenDelta(request.request_id, [], True, "abort",
                                                   error=self._no_replica_message()))
        live = sum(r.alive for r in self.replicas)
        self.log.info("%d request(s) of replica %d %s", len(orphans), index,
                      "moved to the live replicas" if live else "failed: no replica left")
        # Now, ahead of the failed requests' errors (emit), so that /health says 503 by the time a
        # client learns its request failed.
        self.send_status()

    def _no_replica_message(self) -> str:
        reasons = "; ".join(f"replica {r.index}: {r.down_reason}" for r in self.replicas)
        return f"no replica is serving ({reasons})"

    # --- helpers --------------------------------------------------------------------------------

    def _recv(self, channel: PullChannel, with_frames: bool = False):
        while True:
            try:
                return channel.recv_with_frames(0) if with_frames else channel.recv(0)
            except BadFrame as exc:  # consumed: answer whom it names, then take the next one
                self.on_bad_message(exc)

    def on_bad_message(self, exc: BadFrame) -> None:
        """A message that does not decode fails what it names and nothing else."""
        names, kind = exc.names, exc.type_name
        self.problems.warning(f"bad {kind or 'unknown'} message", str(exc))
        if kind == "TokenizedRequest" and isinstance(names.get("request_id"), str):
            self._rejected.append(Rejected(names["request_id"], f"invalid request: {exc}", status=500))
        elif kind == "AbortRequest" and isinstance(names.get("request_id"), str):
            self.abort(names["request_id"])
        elif kind == "FlushCache" and isinstance(names.get("query_id"), str):
            self.outputs.send(CacheFlushed(names["query_id"], False, error=f"invalid message: {exc}"))
        elif kind == "StepDone" and all(isinstance(names.get(k), int) for k in ("replica", "step_id")):
            # The step's requests fail as after an error inside it; the replica serves on.
            replica, rank = names["replica"], names.get("rank", 0)
            error = f"executor dp={replica} tp={rank} sent a result that does not decode: {exc}"
            self.finish_step(StepDone(replica, int(rank), names["step_id"], error=error), ())
        elif kind == "ReplicaDown" and isinstance(names.get("replica"), int):
            self.take_down(names["replica"], f"the launcher reported replica {names['replica']} down")
        elif kind == "Shutdown":
            self.log.info("shutting down: asked with an unreadable reason")
            self._stopping = True

    def close(self) -> None:
        for replica in self.replicas:
            with contextlib.suppress(Exception):  # closing anyway
                replica.doorbell.send(Stop())
            replica.close()
        self.inputs.close()
        self.results.close()
        self.outputs.close()
