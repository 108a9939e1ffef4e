"""Fault drills: an executor that dies, fails or hangs at a chosen kind of step, for tests and operators.

Set CADENCE_INJECT_FAULT in the environment of the process that starts the launcher, e.g.

    CADENCE_INJECT_FAULT="dp=1 tp=0 at=decode after=20" cadence serve --dp 2 ...

and executor dp=1 tp=0 sends itself SIGKILL (with `do=raise` it raises an exception inside the
step, as a CUDA error or a bug would; with `do=hang` it stops itself with SIGSTOP, as a wedged GPU
or a deadlock would look: alive, silent) just before it launches the first step numbered 20 or later
whose plan is of that kind: `prefill` (some request runs a chunk of its prompt that does not
reach its end: a long chunked prefill), `mixed` (prompt chunks and one-token decodes in one step),
`decode` (every request decodes one token) or `any`. A SIGKILL is what the kernel's OOM killer
and a driver fault look like from outside: no cleanup, no goodbye. Unset, nothing is checked.

`at=join` strikes at start-up instead, just before the executor joins its replica's TP group:

    CADENCE_INJECT_FAULT="dp=0 tp=1 at=join do=hang" cadence serve --tp 2 --dist-timeout 10 ...

is a rank that never reaches its peers; the others give up after --dist-timeout and name it.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import numpy as np

from core.plan import StepPlan

ENV = "CADENCE_INJECT_FAULT"
STEP_KINDS = ("prefill", "mixed", "decode", "any")
JOIN = "join"  # at start-up, before joining the TP group, not at a step
ACTIONS = ("kill", "raise", "hang")


class InjectedStepError(RuntimeError):
    """What a `do=raise` drill raises inside a step."""


@dataclass(frozen=True)
class InjectedFault:
    replica: int
    rank: int
    at: str  # one of STEP_KINDS, or JOIN
    after_step: int = 0
    action: str = "kill"  # one of ACTIONS

    def __post_init__(self) -> None:
        if self.at not in (*STEP_KINDS, JOIN):
            raise ValueError(f"{ENV}: at={self.at!r} is not one of {', '.join((*STEP_KINDS, JOIN))}")
        if self.action not in ACTIONS:
            raise ValueError(f"{ENV}: do={self.action!r} is not one of {', '.join(ACTIONS)}")
        if self.replica < 0 or self.rank < 0 or self.after_step < 0:
            raise ValueError(f"{ENV}: dp, tp and after must be >= 0, got {self}")

    @classmethod
    def parse(cls, text: str) -> InjectedFault:
        """From "dp=1 tp=0 at=decode after=20 do=kill" (spaces or commas between the fields)."""
        fields = {}
        for item in text.replace(",", " ").split():
            key, sep, value = item.partition("=")
            if not sep or key not in ("dp", "tp", "at", "after", "do"):
                raise ValueError(f"{ENV}: cannot read {item!r}; expected dp=, tp=, at=, after= and do=")
            fields[key] = value
        try:
            return cls(int(fields.get("dp", 0)), int(fields.get("tp", 0)), fields.get("at", "any"),
                       int(fields.get("after", 0)), fields.get("do", "kill"))
        except ValueError as exc:
            raise ValueError(f"{ENV}={text!r}: {exc}") from None

    def fires(self, plan: StepPlan) -> bool:
        return self.at != JOIN and plan.step_id >= self.after_step and step_kind_matches(plan, self.at)


def step_kind_matches(plan: StepPlan, kind: str) -> bool:
    chunks = np.diff(plan.query_start[: plan.num_reqs + 1])
    decodes = chunks == 1
    if kind == "any":
        return True
    if kind == "decode":
        return bool(decodes.all())
    if kind == "mixed":
        return bool(decodes.any() and (~decodes).any())
    return bool(((chunks > 1) & (plan.logits_index[: plan.num_reqs] < 0)).any())  # prefill


def fault_for(replica: int, rank: int) -> InjectedFault | None:
    """The fault this executor is to suffer, from the environment; None for the others."""
    text = os.environ.get(ENV)
    if not text:
        return None
    fault = InjectedFault.parse(text)
    return fault if (fault.replica, fault.rank) == (replica, rank) else None


def strike(fault: InjectedFault, step_id: int | None = None) -> None:
    """Suffer the fault now (at step `step_id`, or at start-up when None): SIGKILL or SIGSTOP this
    process, or raise InjectedStepError."""
    if fault.action == "raise":
        where = "joining the TP group" if step_id is None else f"step {step_id}"
        raise InjectedStepError(f"fault drill: {where} failed on purpose")
    os.kill(os.getpid(), signal.SIGSTOP if fault.action == "hang" else signal.SIGKILL)
