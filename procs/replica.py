"""One DP replica as the scheduler process sees it: its Scheduler, ring, doorbell, steps in flight,
and how to tell that it is stuck.

procs/scheduler_proc.py owns a list of these. A replica is alive until its executor dies (the
launcher says so) or until its oldest step in flight outlives the step timeout; `stuck_ranks` then
names the ranks that never took the step from the ring, or all of them when every rank took it and
none answered (a hang inside the step: a collective, a kernel).
"""

from __future__ import annotations

import os
import signal
from collections import deque
from dataclasses import dataclass

from core.plan import StepPlan
from core.scheduling.plan_ahead import PlanAhead
from core.scheduling.scheduler import Scheduler
from ipc.channels import PubChannel
from ipc.messages import ReplicaInfo
from ipc.plan_layout import packed_plan_nbytes
from ipc.process_specs import SchedulerSpec
from ipc.shm_ring import StepRing, ring_name


@dataclass
class InFlight:
    plan: StepPlan
    sent_s: float
    back_to_back: bool = False  # launched while the replica had work since its previous step


class Replica:
    """One DP replica as the scheduler sees it: its scheduler, ring, doorbell and step in flight."""

    def __init__(self, index: int, spec: SchedulerSpec, num_pages: int) -> None:
        config = spec.config
        model = config.model
        eos = model.generation.eos_token_ids or ((model.eos_token_id,) if model.eos_token_id is not None
                                                 else ())
        self.index = index
        self.num_pages = num_pages
        self.tp_size = config.parallel.tp_size
        # Async scheduling: the next step goes out while this one runs.
        self.scheduler = Scheduler(config.scheduler, config.cache, num_pages, config.max_model_len,
                                   eos_token_ids=eos, seed=config.seed + index, replica=index,
                                   max_steps_in_flight=2 if config.scheduler.async_scheduling else 1)
        sched = config.scheduler
        max_pages = -(-config.max_model_len // config.cache.block_size)
        # Room for a full step; penalty histories past this go as a frame on the doorbell instead.
        slot_bytes = packed_plan_nbytes(sched.max_num_seqs, sched.max_num_batched_tokens, max_pages,
                                        4 * sched.max_num_batched_tokens)
        self.ring = StepRing.create(ring_name(spec.run_id, index), spec.ring_slots, slot_bytes, self.tp_size)
        self.doorbell = PubChannel.bind(spec.doorbells[index], name=f"doorbell of replica {index}")
        self.executor_pids = list(spec.executor_pids[index]) if spec.executor_pids else []
        self.alive = True
        self.down_reason: str | None = None
        self.in_flight: deque[InFlight] = deque()  # oldest first; results come back in this order
        self.plan_ahead = PlanAhead()  # async scheduling: when to plan the step behind the running one
        self.has_work = False  # unfinished requests after the last step came back
        self.ring_held_since: float | None = None  # since when a rank has held the ring's next slot
        self.step_execute_s = 0.0
        self.step_wait_s = 0.0

    def record_timings(self, flight: InFlight, timings_ms: dict[str, float]) -> None:
        """Add a finished step's executor timings; its wait counts only after a back-to-back launch."""
        self.step_execute_s += timings_ms.get("execute", 0.0) / 1e3
        if flight.back_to_back:
            self.step_wait_s += timings_ms.get("wait", 0.0) / 1e3

    def rank_names(self, ranks: list[int] | None = None) -> str:
        """'executor dp=I tp=R' for each of `ranks` (all by default), comma-separated: for messages."""
        ranks = list(range(self.tp_size)) if ranks is None else ranks
        return ", ".join(f"executor dp={self.index} tp={r}" for r in ranks)

    def overdue_step(self, now_s: float, timeout_s: float) -> InFlight | None:
        """The oldest step in flight if it has run past `timeout_s` on a live replica."""
        flight = self.in_flight[0] if self.in_flight else None
        if self.alive and flight is not None and now_s - flight.sent_s > timeout_s:
            return flight
        return None

    def ring_free(self, now_s: float) -> bool:
        """Whether the next plan can go into the ring at once; remembers since when it cannot."""
        if self.ring.stuck_readers():
            self.ring_held_since = self.ring_held_since or now_s
            return False
        self.ring_held_since = None
        return True

    def ring_stuck_reason(self, now_s: float, timeout_s: float) -> str | None:
        """Why this replica is stuck if a rank has held the ring's next slot for over `timeout_s`."""
        held = self.ring_held_since
        if not self.alive or held is None or now_s - held <= timeout_s:
            return None
        stuck = self.ring.stuck_readers()
        return (f"{self.rank_names(stuck)} did not take a step from the ring within {timeout_s:g} s"
                if stuck else None)

    def stuck_reason(self, flight: InFlight, timeout_s: float) -> str:
        """Who is stuck on an overdue step, and where: before taking it, or inside it."""
        step_id = flight.plan.step_id
        behind = [rank for rank, s in enumerate(self.ring.taken_steps()) if s < step_id]
        if behind:
            return (f"{self.rank_names(behind)} did not take step {step_id} from the ring within "
                    f"{timeout_s:g} s")
        return (f"{self.rank_names()} took step {step_id} but no result came within {timeout_s:g} s "
                f"(stuck inside the step; a step this long on purpose needs a larger --step-timeout)")

    def kill_executors(self) -> list[int]:
        """SIGKILL this replica's executors (a stuck one holds its card's memory and never answers);
        returns the pids that were still there. The launcher sees them die."""
        killed = []
        for pid in self.executor_pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            killed.append(pid)
        return killed

    def info(self, routed_load_tokens: int) -> ReplicaInfo:
        stats = self.scheduler.stats() if self.alive else None
        return ReplicaInfo(self.index, self.alive, self.down_reason, self.num_pages, stats,
                           self.step_execute_s, self.step_wait_s, routed_load_tokens)

    def close(self) -> None:
        self.doorbell.close()
        self.ring.close()
        self.ring.unlink()
