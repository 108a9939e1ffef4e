"""How the generalization matrix decides that two runs of one request agree.

Both runs ask for logprobs (the sampled token's and the top 2). The rule depends on the dtype:

* float32 (the CPU): the same token ids, position by position, the same count and finish reason,
  and at every position the sampled token's logprob within `logprob_atol` nats (1e-3) of the
  reference's. Another batch, chunking or TP split reorders float32 sums and moves a logprob by
  about 1e-6; a wrong KV page moves it by 1e-2 or more even where the argmax stays the same (the
  dummy weights' greedy output repeats one token, so the token ids alone barely see the context).
* bfloat16 / float16 (a GPU): the same token ids up to the first position where the two runs differ.
  There the divergence is accepted only as a near-tie: in each run both tokens are among that
  run's top logprobs (100: workload.TOP_LOGPROBS), each within `tie_nats` (0.35) of that run's
  best. Another batch shape, chunk split or TP split picks other GEMM kernels, and over 40 layers
  of random bf16 weights that moves a sampled token's logprob by about 0.2 nats over prefixes where
  the two runs agree (the
  largest `max_logprob_diff` of two H200 runs of the matrix: 0.157 and 0.219); the gap between two
  tokens moves by up to twice that, and 0.35 nats accepts the drifts seen without accepting any
  token from outside the top group. The dummy weights' distribution is flat (many tokens within one
  bf16 step of the top), which is why the rule looks past the top 2. This rule catches gross errors
  (a wrong layer, wrong positions, garbage pages); a subtly wrong KV page can hide under bf16 noise,
  and the float32 rule on the CPU (a wrong page moves a logprob by 1e-2, the limit is 1e-3) is what
  pins the paging down. The
  tokens after an accepted divergence continue different contexts and are not compared; the count
  and finish reason still must match. Logprob differences over the agreeing prefix are reported, not
  judged (bf16 batch shapes legitimately move them).
* FP8 on a GPU (bf16 activations quantized to e4m3 per 128 columns before each linear layer): the
  bf16 rule with `tie_nats` 3.0. Quantization turns a 1-ulp bf16 difference of a group's largest
  element into another scale for all 128 of its values, and the random 14B model amplifies it.
  Measured on an H100 (`python -m benchmarks.fp8_near_ties`: 8 prompts of 1,000 tokens, 64
  teacher-forced tokens, 520 positions a variant): multiplying every FP8 product's output by
  1 + 2**-9 * noise before its rounding to bf16, a change of nothing but rounding, flips the greedy
  token at 358 of the 520 positions, with the two tokens up to 2.34 nats apart, and moves the
  top-20 gaps by up to 2.78 nats; prefilling in 16-token chunks flips 252 (up to 2.50 apart),
  decoding among 64 rows 322 (up to 2.28); 16 prompts (1,040 positions) found nothing farther
  apart than 2.53. The same runs in bf16: 43 and 59 flips, at most 0.28 nats apart, hence bf16's
  0.35. 3.0 accepts what rounding alone does to FP8 here and no more
  (the first FP8 tolerance, 1.2, was twice the drift of the sampled token's logprob on prefixes
  where two matrix runs agreed, and six cells failed on divergences 1.22-2.06 nats apart, all
  inside that measured noise). What it still catches is a token more than 3 nats from the best in
  either run; the float32 rule on the CPU and the bf16 rule on the GPU, which run the same
  scheduling, caching and paging code, are the matrix's finer checks. Both tokens must still be
  among both runs' top logprobs (100). On the CPU an FP8
  server computes in float32 from dequantized weights and gets the float32 rule.

Where a run's top logprobs (100) do not reach the other run's token and reach less than `tie_nats`
below its best (the dummy weights' flat distributions: the 100th token can sit 1.4 nats under the
best, inside FP8's 3.0), the runs cannot tell. Then the position is scored again, teacher-forced:
one request per token whose prompt is the job's prompt, the output the two runs shared and that
token, its prompt logprobs giving the token's logprob and the position's best in one computation
(Server.score_next). The divergence is a near-tie if both tokens lie within `tie_nats` of that best.
A token shown more than `tie_nats` under a run's best, or missing from a top that reaches that
deep, fails without a third computation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from api.generation import Generation

EXACT_DTYPES = ("float32",)
TIE_NATS = {None: 0.35, "fp8": 3.0}  # near-tie tolerance by quantization (measured: see above)
# Scores a divergence again: (position, tokens) -> each token's nats under the position's best logprob,
# teacher-forced after the output both runs shared up to `position`.
Scorer = Callable[[int, tuple[int, ...]], dict[int, float]]
TIE, NO_TIE, UNDECIDED = "tie", "no tie", "undecided"


@dataclass(frozen=True)
class Tolerance:
    exact: bool  # float32: token ids equal and logprobs within logprob_atol
    logprob_atol: float = 1e-3  # nats, float32 only
    tie_nats: float = 0.35  # bf16/fp16: a divergence is a near-tie when both tokens are this near the best

    @classmethod
    def for_dtype(cls, dtype: str, logprob_atol: float = 1e-3, tie_nats: float | None = None,
                  quantization: str | None = None) -> Tolerance:
        """`tie_nats` None: TIE_NATS of the quantization (none: bf16/fp16's)."""
        tie_nats = TIE_NATS[quantization] if tie_nats is None else tie_nats
        return cls(exact=dtype in EXACT_DTYPES, logprob_atol=logprob_atol, tie_nats=tie_nats)

    def describe(self) -> str:
        if self.exact:
            return (f"token ids, count and finish identical; sampled-token logprobs within "
                    f"{self.logprob_atol:g} nats")
        return (f"token ids identical up to a near-tie (in both runs both tokens within {self.tie_nats:g} "
                f"nats of the best logprob); count and finish identical")


@dataclass(frozen=True)
class Agreement:
    ok: bool
    message: str = ""  # why not; or, when ok, a note such as an accepted near-tie
    max_logprob_diff: float | None = None  # over the positions compared, when both have logprobs


def compare(reference: Generation, actual: Generation, tolerance: Tolerance,
            constrained: bool = False, score: Scorer | None = None) -> Agreement:
    """Whether `actual` reproduces `reference` under `tolerance`; the message names the position.

    `constrained`: a structured output's, whose greedy token is the likeliest the grammar allows,
    often far below the top logprobs. Up to a divergence both runs allowed the same tokens, so at
    a near-tie each run's own token has nearly the logprob the other run's token has there: the
    two chosen tokens' logprobs must be within the tie tolerance. After it the outputs may differ
    in length (the grammar's check of each output is the cell's).

    `score`: what decides a divergence the runs' top logprobs cannot (the module docstring says when)."""
    if actual.refused is not None or actual.error is not None:
        return Agreement(False, f"ended with an error: {actual.error}")
    ref_ids, ids = reference.token_ids, actual.token_ids
    first = next((i for i, (a, b) in enumerate(zip(ref_ids, ids)) if a != b), None)
    diff = _max_logprob_diff(reference, actual, first if first is not None else min(len(ref_ids), len(ids)))
    note = ""
    if first is not None:
        if tolerance.exact:
            return Agreement(False, f"token {first} is {ids[first]} where the reference has {ref_ids[first]} "
                                    f"({_window(ref_ids, first)} vs {_window(ids, first)})", diff)
        if constrained:
            why = _masked_near_tie(reference, actual, first, tolerance.tie_nats)
            verdict = NO_TIE if why else TIE
        else:
            verdict, why = _near_tie(reference, actual, first, tolerance.tie_nats)
            if verdict == UNDECIDED:
                tokens = (ref_ids[first], ids[first])
                verdict, why = _scored_near_tie(score, first, tokens, tolerance.tie_nats, why)
        if verdict != TIE:
            return Agreement(False, f"token {first} is {ids[first]} where the reference has "
                                    f"{ref_ids[first]}, and it is no near-tie: {why}", diff)
        note = f"diverged at token {first} after a near-tie" + (f" ({why})" if why else "")
    if len(ids) != len(ref_ids) and not (constrained and first is not None):
        return Agreement(False, f"{len(ids)} tokens where the reference has {len(ref_ids)}", diff)
    if actual.finish_reason != reference.finish_reason:
        return Agreement(False, f"finish_reason {actual.finish_reason!r} where the reference has "
                                f"{reference.finish_reason!r}", diff)
    if tolerance.exact and diff is not None and diff > tolerance.logprob_atol:
        where = _worst_logprob_position(reference, actual)
        return Agreement(False, f"the logprob of token {where} differs from the reference's by {diff:.3g} "
                                f"nats (> {tolerance.logprob_atol:g}) though the ids agree", diff)
    return Agreement(True, note, diff)


def _near_tie(reference: Generation, actual: Generation, position: int, tie_nats: float) -> tuple[str, str]:
    """(TIE, "") when the two runs' tokens at `position` are a near-tie in both runs; (NO_TIE, why)
    when a run shows they are not; (UNDECIDED, why) when a run's top logprobs do not reach a token
    and reach less than `tie_nats` under its best, and no run says NO_TIE.

    In each run both tokens must be among its top logprobs, each within `tie_nats` of its best:
    with random bf16 weights three or more tokens often sit within one bf16 step of the top.
    """
    mine, theirs = reference.token_ids[position], actual.token_ids[position]
    undecided = ""
    for name, run in (("reference", reference), ("this run", actual)):
        tops = run.top_logprobs
        if tops is None or len(tops) <= position or len(tops[position]) < 2:
            return NO_TIE, f"{name} has no top logprobs at token {position}"
        logprobs = {top.token_id: top.logprob for top in tops[position]}
        best = tops[position][0].logprob
        shown = [logprobs[token] for token in (mine, theirs) if token in logprobs]
        gap = max((best - logprob for logprob in shown), default=0.0)
        if gap > tie_nats:
            return NO_TIE, (f"{name}'s logprobs of {mine} and {theirs} are {gap:.3g} nats apart from its "
                            f"best (> {tie_nats:g})")
        if len(shown) < 2:
            ids = [top.token_id for top in tops[position]]
            depth = best - tops[position][-1].logprob
            why = (f"{name}'s top {len(ids)} at token {position} (down to {depth:.3g} nats under its "
                   f"best) do not hold both tokens {mine} and {theirs}; the first ten: {ids[:10]}")
            if depth >= tie_nats:
                return NO_TIE, why
            undecided = undecided or why
    return (UNDECIDED, undecided) if undecided else (TIE, "")


def _scored_near_tie(score: Scorer | None, position: int, tokens: tuple[int, int], tie_nats: float,
                     undecided: str) -> tuple[str, str]:
    """Decide an UNDECIDED divergence by scoring both tokens again, teacher-forced."""
    if score is None:
        return NO_TIE, f"{undecided}, and nothing scores the position again"
    try:
        gaps = score(position, tokens)
    except Exception as exc:  # noqa: BLE001 - a scoring that fails leaves the divergence unproven
        return NO_TIE, f"{undecided}; scoring it again failed: {type(exc).__name__}: {exc}"
    said = ", ".join(f"{token} {gaps[token]:.3g}" for token in tokens)
    if max(gaps[token] for token in tokens) > tie_nats:
        return NO_TIE, (f"{undecided}; teacher-forced, the tokens lie {said} nats under the best "
                        f"(> {tie_nats:g})")
    return TIE, f"beyond a run's top logprobs; teacher-forced, {said} nats under the best"


def _masked_near_tie(reference: Generation, actual: Generation, position: int, tie_nats: float) -> str | None:
    """None when the tokens each run chose at `position` have logprobs within `tie_nats`."""
    if reference.logprobs is None or actual.logprobs is None:
        return f"no logprobs at token {position}"
    gap = abs(reference.logprobs[position] - actual.logprobs[position])
    if gap > tie_nats:
        return (f"among the tokens the grammar allows, the reference's has logprob "
                f"{reference.logprobs[position]:.4g} and this run's {actual.logprobs[position]:.4g}, "
                f"{gap:.3g} nats apart (> {tie_nats:g})")
    return None


def _max_logprob_diff(reference: Generation, actual: Generation, upto: int) -> float | None:
    if reference.logprobs is None or actual.logprobs is None:
        return None
    pairs = list(zip(reference.logprobs[:upto], actual.logprobs[:upto]))
    return max((abs(a - b) for a, b in pairs), default=0.0)


def _worst_logprob_position(reference: Generation, actual: Generation) -> int:
    diffs = [abs(a - b) for a, b in zip(reference.logprobs or [], actual.logprobs or [])]
    return max(range(len(diffs)), key=diffs.__getitem__, default=0)


def _window(ids: list[int], position: int) -> list[int]:
    return ids[max(0, position - 2) : position + 3]
