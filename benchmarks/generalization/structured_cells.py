"""The structured-output cell of the generalization matrix, and the check every cell that runs a
structured job applies: the output is what its spec asked for (JSON its schema accepts, tool-call
blocks of the offered tool, one of the choices, text the grammar derives), whatever the model's
weights."""

from __future__ import annotations

import json
import re

from api.generation import Generation
from benchmarks.generalization.cell import Cell, CellContext
from benchmarks.generalization.workload import (
    STRUCTURED_CHOICES,
    STRUCTURED_GRAMMAR_TEXT,
    STRUCTURED_SCHEMA,
    STRUCTURED_TOOL,
    Job,
)
from benchmarks.lib.schema_check import conforms


def structured_cell() -> Cell:
    return Cell("structured outputs", "a JSON schema (greedy and seeded), tool calls, a choice, compact "
                "JSON and a GBNF grammar, alone: each ends by its grammar (finish stop) with an output its "
                "spec accepts; then "
                "at once with free requests: the same outputs; the reference of the layouts' structured "
                "jobs", _structured)


def structured_problem(job: Job, generation: Generation) -> str | None:
    """Why `generation` is not what `job`'s structured output asked for, or None."""
    kind = json.loads(job.params.structured_output)["type"]
    if generation.finish_reason != "stop":
        return f"{job.key}: finish_reason {generation.finish_reason!r}: the grammar did not end it"
    text = generation.text
    try:
        if kind == "json_schema":
            ok = conforms(json.loads(text), STRUCTURED_SCHEMA)
        elif kind == "choice":
            ok = text in STRUCTURED_CHOICES
        elif kind == "grammar":
            ok = re.fullmatch(STRUCTURED_GRAMMAR_TEXT, text) is not None
        else:
            blocks = [b.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")
                      for b in text.split("\n<tool_call>\n")]
            calls = [json.loads(block) for block in blocks]
            schema = STRUCTURED_TOOL["parameters"]
            ok = 1 <= len(calls) <= 2 and all(call["name"] == STRUCTURED_TOOL["name"]
                                              and conforms(call["arguments"], schema) for call in calls)
    except (ValueError, KeyError, TypeError) as e:
        return f"{job.key}: {text[:120]!r} does not parse: {e}"
    if ok and json.loads(job.params.structured_output).get("compact"):
        ok = not any(c.isspace() for c in re.sub(r'"(?:[^"\\]|\\.)*"', '""', text))
    return None if ok else f"{job.key}: {text[:120]!r} is not what the spec asks for"


def check_structured(ctx: CellContext, jobs: list[Job], results: dict[str, Generation]) -> None:
    for job in jobs:
        if job.params.structured_output and job.key in results:
            problem = structured_problem(job, results[job.key])
            ctx.checks.expect(problem is None, problem or "")


def _structured(ctx: CellContext) -> None:
    checks, workload = ctx.checks, ctx.workload
    jobs = workload.structured_jobs()
    alone = {}
    for job in jobs:
        alone.update(ctx.server.run([job]))
    check_structured(ctx, jobs, alone)
    if checks.passed:
        ctx.refs.update({job.key: alone[job.key] for job in jobs})
    together = ctx.server.run([*jobs, *workload.batch[:3]])
    check_structured(ctx, jobs, together)
    for job in jobs:
        if job.params.is_greedy or checks.tolerance.exact:
            checks.agree(job.key, alone[job.key], together[job.key], "alone", constrained=True)
    checks.details["output_tokens"] = {job.key: len(alone[job.key].token_ids) for job in jobs}
