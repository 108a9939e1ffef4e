"""A cell of the generalization matrix: one named set of invariants checked on one running server.

A cell's function gets a `CellContext`: the server, the workload, the reference outputs every
server shares (by job key), and `Checks`, which records each failed invariant with a message that
names the request and the numbers, instead of stopping at the first. The matrix runner
(benchmarks/generalization/matrix.py) adds the pool-balance check after every cell.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from api.generation import Generation
from benchmarks.generalization.compare import Tolerance, compare
from benchmarks.generalization.server import Server
from benchmarks.generalization.workload import Job, Workload

# (job key, the output before the position, tokens) -> each token's nats under the position's best
NextTokenScorer = Callable[[str, Sequence[int], Sequence[int]], dict[int, float]]


class Checks:
    """The failed invariants of one cell, and what it measured along the way. `score_next` (the cell's
    server's Server.score_next) decides divergences the runs' top logprobs cannot (compare.py)."""

    def __init__(self, tolerance: Tolerance, score_next: NextTokenScorer | None = None) -> None:
        self.tolerance = tolerance
        self.score_next = score_next
        self.failures: list[str] = []
        self.details: dict[str, object] = {}
        self.notes: list[str] = []
        self.num_compared = 0
        self.max_logprob_diff: float | None = None

    @property
    def passed(self) -> bool:
        return not self.failures

    def expect(self, ok: bool, message: str) -> bool:
        if not ok:
            self.failures.append(message)
        return ok

    def finished(self, job: Job, generation: Generation, finish_reason: str = "length") -> bool:
        """It ran to `finish_reason` (a structured output: to its grammar's end, "stop"); a length
        finish has exactly max_tokens tokens; a greedy token is the model's most likely one, except
        under a structured output, which masks the others (its logprobs stay the model's)."""
        if job.params.structured_output:
            finish_reason = "stop"
        if generation.refused is not None or generation.error is not None:
            return self.expect(False, f"{job.key}: ended with an error: {generation.error}")
        ok = self.expect(generation.finish_reason == finish_reason,
                         f"{job.key}: finish_reason {generation.finish_reason!r}, expected {finish_reason!r}")
        ok &= self.expect(generation.num_prompt_tokens == len(job.prompt), f"{job.key}: num_prompt_tokens "
                          f"{generation.num_prompt_tokens}, sent {len(job.prompt)}")
        if finish_reason == "length":
            ok &= self.expect(len(generation.token_ids) == job.params.max_tokens, f"{job.key}: "
                              f"{len(generation.token_ids)} tokens, max_tokens {job.params.max_tokens}")
        if (job.params.is_greedy and not job.params.has_penalties and not job.params.structured_output
                and generation.top_logprobs):
            ok &= self._greedy_is_top1(job.key, generation)
        return ok

    def _greedy_is_top1(self, key: str, generation: Generation) -> bool:
        """A greedy token is the first of its top logprobs (or ties it), and logprobs are <= 0."""
        for i, (token, logprob, top) in enumerate(zip(generation.token_ids, generation.logprobs or [],
                                                       generation.top_logprobs or [])):
            best = top[0] if top else None
            if best is None or logprob > 0 or (best.token_id != token and best.logprob > logprob):
                tops = [(t.token_id, t.logprob) for t in top]
                return self.expect(False, f"{key}: greedy token {i} is {token} (logprob {logprob:.4g}) but "
                                          f"the top logprobs are {tops}")
        return True

    def agree(self, key: str, reference: Generation | None, actual: Generation | None, against: str,
              constrained: bool = False) -> bool:
        """`actual` reproduces `reference` (the run of the same key `against` names) under the tolerance
        (`constrained`: a structured output's; compare.py says what changes)."""
        if reference is None or actual is None:
            missing = "reference" if reference is None else "output"
            return self.expect(False, f"{key}: no {missing} to compare (the cell that makes it failed)")
        self.num_compared += 1
        score = None
        if self.score_next is not None:
            def score(position: int, tokens: tuple[int, ...]) -> dict[int, float]:
                return self.score_next(key, reference.token_ids[:position], tokens)
        agreement = compare(reference, actual, self.tolerance, constrained, score)
        if agreement.max_logprob_diff is not None:
            self.max_logprob_diff = max(self.max_logprob_diff or 0.0, agreement.max_logprob_diff)
        if agreement.ok and agreement.message:
            self.notes.append(f"{key}: {agreement.message} (against {against})")
        return self.expect(agreement.ok, f"{key}: {agreement.message} (against {against})")

    def agree_all(self, outputs: dict[str, Generation], references: dict[str, Generation],
                  against: str) -> None:
        for key, generation in outputs.items():
            self.agree(key, references.get(key), generation, against)

    def summary(self) -> dict[str, object]:
        out = dict(self.details)
        if self.num_compared:
            out["outputs_compared"] = self.num_compared
        if self.max_logprob_diff is not None:
            out["max_logprob_diff"] = float(f"{self.max_logprob_diff:.3g}")
        if self.notes:
            out["notes"] = self.notes
        return out


@dataclass
class CellContext:
    server: Server
    workload: Workload
    checks: Checks
    refs: dict[str, Generation]  # reference outputs by job key, shared by every server
    shared: dict[str, object] = field(default_factory=dict)  # what one cell leaves for a later one


@dataclass(frozen=True)
class Cell:
    name: str
    checks: str  # what it checks, in a sentence
    run: Callable[[CellContext], None]
