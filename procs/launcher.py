"""The launcher: starts every process, waits for their READY, supervises them, shuts them down.

Start order: the executors (all replicas, all TP ranks) and the tokenizer at once; when every
executor has reported its KV pages, the scheduler, which sizes each replica's pool to the minimum
over its ranks and pings every rank before it reports READY itself. A child that fails to start
sends its error through the handshake and the launcher raises LaunchError with it, naming the
child and its device (and, for a TP rank, the peers still starting: the one that never joined is
among them). Before anything starts, procs/devices.py checks that the cards the layout needs are
visible. A TP rank that cannot reach its peers gives up after --dist-timeout
(core/execution/distributed.py), so a broken multi-card start-up ends with a name, not in a hang.

Supervision waits on the children's sentinels, so a death is noticed at once. A dead executor
takes its replica down (the scheduler moves the replica's requests to live ones) and its TP peers
are ended (SIGTERM, SIGKILL 3 s later) so that their memory comes back; a dead scheduler or
tokenizer ends serving. Shutdown goes tokenizer -> scheduler (which stops its executors) ->
executors, each with a deadline and SIGKILL after it; the run's sockets and /dev/shm segments are
removed whatever happened.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing as mp
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path

from core.config import EngineConfig
from ipc.channels import PushChannel
from ipc.codec import CodecError, decode, encode
from ipc.endpoints import Endpoints, default_runtime_root
from ipc.messages import ReplicaDown, Shutdown
from ipc.process_specs import ExecutorSpec, Ready, SchedulerSpec, TokenizerSpec
from ipc.run_lock import remove_ended_runs
from ipc.shm_ring import cleanup_stale, ring_name, run_prefix
from procs.args import add_engine_args, config_from_args, launch_options_from_args
from procs.devices import GPUCountError, assign_devices
from procs.executor_proc import run_executor
from procs.executor_start import executor_context, process_args
from procs.launch_options import LaunchOptions
from procs.scheduler_proc import run_scheduler
from procs.tokenizer_proc import run_tokenizer

log = logging.getLogger("cadence.launcher")

# Between two decode steps the scheduler takes well under a millisecond to plan the next one.
SPIN_S = 1e-3
# How long the surviving ranks of a dead TP replica get to exit on SIGTERM before SIGKILL.
_PEER_GRACE_S = 3.0


class LaunchError(RuntimeError):
    """A process failed to start; the message names it and carries its own error."""


@dataclass
class Child:
    name: str  # "executor dp=0 tp=1", "scheduler", "tokenizer"
    process: mp.Process
    ready_conn: Connection
    replica: int = -1
    device: str = ""  # an executor's "cpu" or "cuda:N"
    ready: Ready | None = None

    @property
    def label(self) -> str:
        """The name, with the device for an executor: "executor dp=0 tp=1 on cuda:1"."""
        return f"{self.name} on {self.device}" if self.device else self.name


@dataclass
class _ReplicaState:
    alive: bool = True
    reason: str | None = None
    executors: list[Child] = field(default_factory=list)


class Launcher:
    def __init__(self, config: EngineConfig, options: LaunchOptions | None = None,
                 on_fatal: Callable[[str], None] | None = None) -> None:
        """`on_fatal(reason)` is called, from the supervisor thread, when the scheduler or the
        tokenizer dies: serving has stopped for good (`cadence serve` then fails what is waiting and
        exits)."""
        self.config = config
        self.options = options or LaunchOptions()
        self.on_fatal = on_fatal
        self.run_id = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.endpoints: Endpoints | None = None
        self.tokenizer: Child | None = None
        self.scheduler: Child | None = None
        self.replicas = [_ReplicaState() for _ in range(config.parallel.dp_size)]
        self.fatal_error: str | None = None  # the scheduler or tokenizer died
        self._ctx = mp.get_context("spawn")
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = self._ctx.Pipe(duplex=False)
        self._supervisor: threading.Thread | None = None
        self._lock = threading.Lock()

    # --- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Launcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def serving(self) -> bool:
        return self.fatal_error is None and any(r.alive for r in self.replicas)

    @property
    def executors(self) -> list[Child]:
        return [c for r in self.replicas for c in r.executors]

    @property
    def children(self) -> list[Child]:
        return [c for c in (self.tokenizer, self.scheduler, *self.executors) if c is not None]

    def start(self) -> None:
        """Start everything and return once the whole system is ready; LaunchError otherwise."""
        config, options = self.config, self.options
        try:
            devices = assign_devices(config)
            executor_ctx = executor_context()
        except (GPUCountError, ValueError) as exc:
            raise LaunchError(str(exc)) from None
        cleanup_stale(run_prefix(self.run_id))
        root = Path(options.runtime_root) if options.runtime_root else default_runtime_root()
        for run_id in remove_ended_runs(root):  # runs killed whole: nobody else will
            cleanup_stale(run_prefix(run_id))
            log.info("removed what run %s left behind (its launcher is gone)", run_id)
        self.endpoints = eps = Endpoints.create(self.run_id, config.parallel.dp_size,
                                                runtime_root=options.runtime_root)
        log.info("starting %s: dp=%d tp=%d on %s; rank 0 of each replica logs its start-up phases",
                 config.model.name, config.parallel.dp_size, config.parallel.tp_size, config.device)
        try:
            for replica in range(config.parallel.dp_size):
                for spec in self._executor_specs(replica, devices):
                    child = self._spawn(f"executor dp={replica} tp={spec.rank}", run_executor, spec,
                                        executor_ctx)
                    child.replica, child.device = replica, spec.device
                    self.replicas[replica].executors.append(child)
            self.tokenizer = self._spawn("tokenizer", run_tokenizer, TokenizerSpec(
                config, options.served_model_name or config.model.name,
                options.tokenizer_path or config.model.model_path,
                eps.tokenizer_frontend, eps.scheduler_input, eps.tokenizer_output,
                options.native_tcp, options.native_api_key, str(eps.runtime_dir), options.chat_template))
            deadline = time.monotonic() + options.startup_timeout_s
            self._await_ready([*self.executors, self.tokenizer], deadline)
            num_pages = [min(c.ready.num_pages for c in r.executors) for r in self.replicas]
            self.scheduler = self._spawn("scheduler", run_scheduler, SchedulerSpec(
                config, self.run_id, num_pages, eps.scheduler_input, eps.tokenizer_output, eps.results,
                list(eps.doorbells), options.step_timeout_s,
                executor_pids=[[c.process.pid for c in r.executors] for r in self.replicas]))
            self._await_ready([self.scheduler], deadline)
        except BaseException:
            self.shutdown()
            raise
        self._supervisor = threading.Thread(target=self._supervise, name="cadence-supervisor", daemon=True)
        self._supervisor.start()
        log.info("serving %s: dp=%d tp=%d on %s, KV pages per replica %s", config.model.name,
                 config.parallel.dp_size, config.parallel.tp_size, config.device, num_pages)

    def shutdown(self) -> None:
        """Stop everything in order; safe to call twice and from a signal handler's thread."""
        with self._lock:
            if self._stopping.is_set() and self.endpoints is None:
                return
            self._stopping.set()
            try:
                self._stop_children()
            finally:  # whatever interrupted the stop (a second signal), the run's files go
                for child in self.children:
                    if child.process.pid is not None and child.process.is_alive():
                        child.process.kill()
                cleanup_stale(run_prefix(self.run_id))
                if self.endpoints is not None:
                    self.endpoints.cleanup()
                    self.endpoints = None

    def _stop_children(self) -> None:
        """Tokenizer, then scheduler (which stops its executors), then executors, each with a deadline."""
        with contextlib.suppress(OSError):
            self._wake_w.send_bytes(b"stop")
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(timeout=5)
        timeout = self.options.shutdown_timeout_s
        if self.tokenizer is not None:  # no message stops it: SIGTERM at once, its loop unwinds
            _stop(self.tokenizer, timeout, grace_s=0.0)
        relayed = False  # whether a live scheduler sent its executors Stop on the way out
        if self.scheduler is not None and self.scheduler.process.is_alive() and self.endpoints:
            with contextlib.suppress(Exception), PushChannel.connect(
                    self.endpoints.scheduler_input, name="launcher to scheduler", send_timeout_s=1) as ch:
                ch.send(Shutdown("the launcher is shutting down"))
                self.scheduler.process.join(timeout)
                relayed = self.scheduler.process.exitcode == 0
            _stop(self.scheduler, timeout)
        for child in self.executors:  # Stop reached them (join in parallel), or SIGTERM does
            child.process.join(timeout if relayed else 0.0)
            _stop(child, timeout)

    # --- startup helpers ------------------------------------------------------------------------

    def _executor_specs(self, replica: int, devices: list[str]) -> list[ExecutorSpec]:
        config, eps = self.config, self.endpoints
        tp = config.parallel.tp_size
        mine = devices[replica * tp : (replica + 1) * tp]
        distinct_cards = len(set(mine)) == tp and mine[0].startswith("cuda")
        init_method = f"tcp://127.0.0.1:{_free_port()}" if tp > 1 else ""
        return [
            ExecutorSpec(config, replica, rank, device, eps.doorbell(replica), eps.results,
                         ring_name(self.run_id, replica), init_method, "nccl" if distinct_cards else "gloo",
                         kv_memory_share=1.0 / devices.count(device), spin_s=_spin_s(config),
                         dist_timeout_s=self.options.dist_timeout_s,
                         tokenizer_path=self.options.tokenizer_path or config.model.model_path)
            for rank, device in enumerate(mine)
        ]

    def _spawn(self, name: str, target, spec, context=None) -> Child:
        """Start one child: spawned, or (an executor) as procs/executor_start.py says."""
        ready_r, ready_w = self._ctx.Pipe(duplex=False)
        context = context or self._ctx
        target, args = process_args(context, target, (encode(spec), ready_w))
        process = context.Process(target=target, args=args, name=f"cadence-{name}")
        process.start()
        ready_w.close()  # the child holds the write end; EOF here means it died
        return Child(name, process, ready_r)

    def _await_ready(self, children: list[Child], deadline: float) -> None:
        pending = {c.ready_conn: c for c in children}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                names = ", ".join(c.label for c in pending.values())
                raise LaunchError(f"{names} did not report ready within {self.options.startup_timeout_s:g} s")
            for conn in wait(list(pending), timeout=left):
                child = pending.pop(conn)
                try:
                    ready = decode(conn.recv_bytes())
                except (EOFError, OSError, CodecError):
                    child.process.join(5)
                    why = (f"{child.label} exited with code {child.process.exitcode} before it was ready; "
                           f"its log above says why{_peers_starting(child, pending)}")
                    raise LaunchError(why) from None
                finally:
                    conn.close()
                if not isinstance(ready, Ready) or ready.error is not None:
                    error = ready.error if isinstance(ready, Ready) else f"unexpected {ready!r}"
                    raise LaunchError(f"{child.label} failed to start: {error}"
                                      f"{_peers_starting(child, pending)}")
                child.ready = ready

    # --- supervision ----------------------------------------------------------------------------

    def _supervise(self) -> None:
        """Wait on every child's sentinel; act on each death the moment it happens."""
        watched = {c.process.sentinel: c for c in self.children}
        to_scheduler = PushChannel.connect(self.endpoints.scheduler_input, name="launcher to scheduler",
                                           send_timeout_s=2)
        try:
            while watched and not self._stopping.is_set():
                for handle in wait([*watched, self._wake_r]):
                    if handle is self._wake_r or self._stopping.is_set():
                        return
                    child = watched.pop(handle)
                    child.process.join(1)
                    self._on_death(child, to_scheduler)
        finally:
            to_scheduler.close()

    def _on_death(self, child: Child, to_scheduler: PushChannel) -> None:
        reason = f"{child.name} exited with code {child.process.exitcode}"
        if child.replica < 0:
            self.fatal_error = reason
            log.error("%s: serving has stopped", reason)
            if self.on_fatal is not None:
                self.on_fatal(reason)
            return
        state = self.replicas[child.replica]
        log.error("%s: replica %d is down", reason, child.replica)
        if state.alive:
            state.alive, state.reason = False, reason
            with contextlib.suppress(Exception):
                to_scheduler.send(ReplicaDown(child.replica, reason))
            peers = [p for p in state.executors if p is not child and p.process.is_alive()]
            if peers:  # its TP peers cannot step alone; ended, so that their cards' memory comes back
                threading.Thread(target=_end_peers, args=(peers, _PEER_GRACE_S), daemon=True,
                                 name=f"cadence-end-replica-{child.replica}").start()

    # --- for tests and operators ----------------------------------------------------------------

    def kill_executor(self, replica: int, rank: int, sig: int = signal.SIGKILL) -> None:
        os.kill(self.replicas[replica].executors[rank].process.pid, sig)


def _end_peers(peers: list[Child], grace_s: float) -> None:
    """SIGTERM the surviving ranks of a dead TP replica, SIGKILL those alive `grace_s` later: a rank
    blocked in a collective with the dead one (NCCL waits inside CUDA, where no Python signal handler
    runs) would otherwise hold its card's memory until the server stops."""
    for peer in peers:
        peer.process.terminate()
    deadline = time.monotonic() + grace_s
    for peer in peers:
        peer.process.join(max(0.0, deadline - time.monotonic()))
        if peer.process.is_alive():
            log.warning("%s did not exit within %g s of SIGTERM; killing it", peer.label, grace_s)
            peer.process.kill()


def _stop(child: Child, timeout_s: float, grace_s: float = 0.5) -> None:
    """Join (for up to `grace_s`: a child told to stop leaves by itself), then SIGTERM, then SIGKILL:
    no child outlives the launcher."""
    process = child.process
    if process.pid is None:
        return
    process.join(0 if not process.is_alive() else min(timeout_s, grace_s))
    if process.is_alive():
        process.terminate()
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)  # a stopped child (a hang drill) takes SIGTERM now
        process.join(timeout_s)
    if process.is_alive():
        log.warning("%s ignored SIGTERM for %g s; killing it", child.name, timeout_s)
        process.kill()
        process.join(5)


def _peers_starting(child: Child, pending: dict[Connection, Child]) -> str:
    """For an executor: its replica's ranks that have not reported ready, e.g. the rank that never
    joined the TP group its peer gave up on."""
    peers = [c.label for c in pending.values() if c.replica == child.replica and c.replica >= 0]
    return f" (still starting: {', '.join(peers)})" if peers else ""


def _spin_s(config: EngineConfig) -> float:
    """Executors watch the ring between steps only when every process can have a core of its own."""
    spare_cores = (os.cpu_count() or 1) - config.parallel.world_size - 2  # the scheduler, the tokenizer
    return SPIN_S if spare_cores >= 2 else 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    """`python -m procs.launcher`: the system without HTTP, for native clients; Ctrl-C stops it."""
    parser = argparse.ArgumentParser(prog="python -m procs.launcher", description=main.__doc__)
    add_engine_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [cadence] %(message)s")
    launcher = Launcher(config_from_args(args), launch_options_from_args(args))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        launcher.start()
    except LaunchError as exc:
        log.error("%s", exc)
        return 1
    print(f"native clients connect to {launcher.endpoints.tokenizer_frontend}", flush=True)
    try:
        while not stop.wait(0.5):
            if launcher.fatal_error is not None:
                log.error("stopping: %s", launcher.fatal_error)
                return 1
    finally:
        launcher.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
