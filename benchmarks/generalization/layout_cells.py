"""The cells that run on the servers other than the reference: each must reproduce its outputs.

* prefix cache on: cold, hot (the same batch again), a partial-page hit, a next turn and full-prompt
  hits, each with num_cached_tokens as the radix cache should give it (whole pages of the longest
  cached prefix of all but the prompt's last token);
* chunked prefill with a tiny token budget; preemption forced by a small pool; DP 2 and TP 2: the
  probe prompts, the penalties job and the first batch prompts, submitted at once;
* identical prompts at once on the small pool (pages written twice in one step, then shared).
"""

from __future__ import annotations

from api.generation import Generation
from benchmarks.generalization.cell import Cell, CellContext
from benchmarks.generalization.reference_cells import cache_cell_jobs
from benchmarks.generalization.structured_cells import check_structured
from benchmarks.generalization.workload import (
    Job,
    Workload,
    common_prefix_len,
    copies_of,
    expected_cached_tokens,
    num_pages_of,
)


def prefix_cache_cells() -> list[Cell]:
    return [
        Cell("prefix cache cold", "the probe prompts at once on a fresh cache: nothing cached, outputs as "
             "with the cache off", _cold),
        Cell("prefix cache hot", "the same batch again: num_cached_tokens the whole pages of all but the "
             "last prompt token, the hit counter grows by their sum, outputs as with the cache off", _hot),
        Cell("prefix cache partial-page hit", "prompts sharing a prefix that ends mid-page (inside a cached "
             "prompt, and inside its generated tokens): the whole pages before it hit, outputs as with the "
             "cache off", _partial),
        Cell("prefix cache next turn", "a prompt continuing a finished request (its prompt, all its output, "
             "new tokens; prompt + output fill whole pages): it hits the whole pages of all but the last "
             "sampled token, which has no KV; outputs as with the cache off", _next_turn),
        Cell("prefix cache full-prompt hit", "the same prompt twice: a prompt of k*block_size+1 tokens hits "
             "all but its last token, a page-aligned one all but its last page; the same prompt twice at "
             "once: whole pages, outputs as with the cache off", _full_hit),
    ]


def layout_cell(name: str, checks: str) -> Cell:
    return Cell(name, checks, _layout)


def chunked_cell(budget: int) -> Cell:
    return Cell(f"chunked prefill, budget {budget}", f"the probe and first batch prompts at once with "
                f"max_num_batched_tokens {budget}: outputs as unchunked; steps >= computed tokens / {budget}",
                _chunked)


def preemption_cell(name: str = "preemption (small pool)") -> Cell:
    return Cell(name, "the probe and first batch prompts at once on a pool smaller "
                "than their pages: outputs as without preemption, num_preemptions > 0", _preemption)


def identical_prompts_cell(copies: int) -> Cell:
    return Cell(f"{copies} identical prompts at once (small pool)",
                f"{copies} copies of one prompt submitted at once on the small pool (pages written twice "
                "in one step are shared afterwards, duplicates freed and reused): outputs as alone, hits "
                "whole pages below the prompt's length",
                lambda ctx: _identical(ctx, copies))


def layout_jobs(workload: Workload, exclude_longest: bool = False) -> list[Job]:
    """What a layout cell submits at once: one job per prompt length, the penalties, seeded and
    structured-output jobs and the first batch prompts."""
    return [*workload.probe(exclude_longest), workload.penalty_job(), workload.layout_seeded_job(),
            *workload.structured_jobs(), *workload.batch[:7]]


def _agree(ctx: CellContext, jobs: list[Job], results: dict[str, Generation], against: str) -> None:
    """Each output reproduces its reference; a sampled one only in float32, where the logits match to
    1e-6 (in bf16 a sampled token may flip wherever the noise meets a small logit change, and no
    near-tie rule tells that from a bug)."""
    for job in jobs:
        if not job.params.is_greedy and not ctx.checks.tolerance.exact:
            ctx.checks.notes.append(f"{job.key}: sampled, not compared in {ctx.server.config.model.dtype}")
            continue
        ctx.checks.agree(job.key, ctx.refs.get(job.key), results[job.key], against,
                         constrained=bool(job.params.structured_output))
    check_structured(ctx, jobs, results)


def preemption_pool(workload: Workload) -> int:
    """A pool that holds the largest job of the preemption cell but about a third of them all. The
    structured-output jobs are left out of the count: their grammars end them long before their
    max_tokens, so their pages at max_tokens would size the pool past what the jobs hold. The pool
    still admits each of them (a request is refused whose prompt and max_tokens exceed it)."""
    bs = workload.shape.block_size
    jobs = layout_jobs(workload, exclude_longest=True)
    pages = [num_pages_of(job, bs) for job in jobs if not job.params.structured_output]
    admitted = max(num_pages_of(job, bs) for job in jobs)
    return max(max(pages) + 1, admitted, sum(pages) // 3)


# --- the prefix cache -------------------------------------------------------------------------------


def _cached_sequences(ctx: CellContext) -> list[list[int]]:
    """Token sequences whose KV this server's cache holds (the pool never evicts in these cells)."""
    return ctx.shared.setdefault("cached", [])


def _remember(ctx: CellContext, jobs: list[Job], results: dict[str, Generation]) -> None:
    """A finished request leaves the KV of every token but its last sampled one in the cache."""
    for job in jobs:
        generation = results[job.key]
        _cached_sequences(ctx).append((job.prompt + generation.token_ids)[: -1])


def _check_cached(ctx: CellContext, jobs: list[Job], results: dict[str, Generation]) -> dict[str, list[int]]:
    """num_cached_tokens of each job as the cache's contents predict; returns {key: [actual, expected]}."""
    bs = ctx.workload.shape.block_size
    seen = {}
    for job in jobs:
        expected = expected_cached_tokens(job.prompt, _cached_sequences(ctx), bs)
        actual = results[job.key].num_cached_tokens
        seen[job.key] = [actual, expected]
        ctx.checks.expect(actual == expected, f"{job.key}: num_cached_tokens {actual}, expected {expected} "
                                              f"(whole pages of the cached prefix of its first "
                                              f"{len(job.prompt) - 1} tokens)")
    return seen


def _hit_tokens(ctx: CellContext) -> int:
    return sum(r.stats.prefix_cache_hit_tokens for r in ctx.server.stats_now() if r.stats)


def _run_cached(ctx: CellContext, jobs: list[Job], what: str) -> dict[str, Generation]:
    """Run `jobs` at once; check the cache hit of each, the counter and the outputs; remember them."""
    before = _hit_tokens(ctx)
    results = ctx.server.run(jobs)
    for job in jobs:
        ctx.checks.finished(job, results[job.key])
    seen = _check_cached(ctx, jobs, results)
    _agree(ctx, jobs, results, "the cache off")
    gained = _hit_tokens(ctx) - before
    ctx.checks.expect(gained == sum(actual for actual, _ in seen.values()),
                      f"{what}: prefix_cache_hit_tokens grew by {gained}, the requests report "
                      f"{sum(actual for actual, _ in seen.values())}")
    ctx.checks.details.setdefault("num_cached_tokens [actual, expected]", {}).update(seen)
    _remember(ctx, jobs, results)
    return results


def _cold(ctx: CellContext) -> None:
    jobs = ctx.workload.probe()
    results = _run_cached(ctx, jobs, "cold")
    ctx.checks.expect(all(g.num_cached_tokens == 0 for g in results.values()),
                      "a cold cache reported a hit (the prompts share no prefix)")


def _hot(ctx: CellContext) -> None:
    bs = ctx.workload.shape.block_size
    results = _run_cached(ctx, ctx.workload.probe(), "hot")
    for job in ctx.workload.probe():
        whole_pages = (len(job.prompt) - 1) // bs * bs
        hit = results[job.key].num_cached_tokens
        ctx.checks.expect(hit == whole_pages,
                          f"{job.key}: a second identical run hit {hit} tokens, expected {whole_pages}")


def _partial(ctx: CellContext) -> None:
    jobs = [j for j in cache_cell_jobs(ctx) if j.key.startswith("partial-")]
    if not ctx.checks.expect(bool(jobs), "no partial-page prompt (the reference of their source is missing)"):
        return
    bs = ctx.workload.shape.block_size
    source = ctx.workload.shared_prefix_source()
    sequence = source.prompt + ctx.refs[source.key].token_ids
    for job in jobs:
        shared = common_prefix_len(job.prompt, sequence)
        ctx.checks.details.setdefault("shared_prefix_len", {})[job.key] = shared
        ctx.checks.expect(shared % bs != 0, f"{job.key}: the shared prefix {shared} ends on a page boundary")
    results = _run_cached(ctx, jobs, "partial")
    ctx.checks.expect(all(g.num_cached_tokens > 0 for g in results.values()),
                      "a prompt sharing whole pages with a cached one hit nothing")


def _next_turn(ctx: CellContext) -> None:
    jobs = [j for j in cache_cell_jobs(ctx) if j.key.startswith("turn2-")]
    if not ctx.checks.expect(bool(jobs), "no next-turn prompt (the reference of its source is missing)"):
        return
    source = ctx.workload.next_turn_source()
    results = _run_cached(ctx, jobs, "next turn")
    if not ctx.checks.tolerance.exact:
        return  # a near-tie may have given this server another source output: the cache's contents decide
    computed = len(source.prompt) + source.params.max_tokens - 1  # the last sampled token has no KV
    expected = computed // ctx.workload.shape.block_size * ctx.workload.shape.block_size
    for job in jobs:
        hit = results[job.key].num_cached_tokens
        ctx.checks.expect(hit == expected, f"{job.key}: hit {hit} tokens of the {computed} with KV in "
                                           f"{source.key}, expected {expected}")


def _full_hit(ctx: CellContext) -> None:
    jobs = [j for j in cache_cell_jobs(ctx) if j.key.startswith("full")]
    bs = ctx.workload.shape.block_size
    _run_cached(ctx, jobs, "full, first run")
    second = _run_cached(ctx, jobs, "full, second run")
    for job in jobs:
        length = len(job.prompt)
        expected = length - 1 if length % bs == 1 else (length - 1) // bs * bs
        hit = second[job.key].num_cached_tokens
        ctx.checks.expect(hit == expected, f"{job.key}: the second run hit {hit} tokens, expected {expected}"
                                           + (" (all but the last token)" if length % bs == 1 else ""))
    twin = ctx.workload.twin_job()
    pair = ctx.server.run(copies_of(twin))
    limit = expected_cached_tokens(twin.prompt, [twin.prompt], bs)
    for key, generation in pair.items():
        ctx.checks.agree(key, ctx.refs.get(twin.key), generation, "the cache off")
        hit = generation.num_cached_tokens
        ctx.checks.expect(hit % bs == 0 and hit <= limit,
                          f"{key}: sent twice at once, hit {hit} tokens: not whole pages up to {limit}")
    ctx.checks.details["twin num_cached_tokens"] = [g.num_cached_tokens for g in pair.values()]
    _remember(ctx, copies_of(twin), pair)


# --- chunked prefill, preemption, DP and TP ---------------------------------------------------------


def _layout(ctx: CellContext) -> None:
    jobs = layout_jobs(ctx.workload)
    results = ctx.server.run(jobs)
    for job in jobs:
        ctx.checks.finished(job, results[job.key])
    _agree(ctx, jobs, results, "DP1 TP1")
    replicas = ctx.server.stats_now()
    ctx.checks.details["prompt_tokens_per_replica"] = [r.stats.num_prompt_tokens for r in replicas if r.stats]
    if len(replicas) > 1:
        ctx.checks.expect(all(r.stats and r.stats.num_prompt_tokens > 0 for r in replicas),
                          f"a replica got no request: prompt tokens per replica "
                          f"{ctx.checks.details['prompt_tokens_per_replica']}")


def _chunked(ctx: CellContext) -> None:
    budget = ctx.server.config.scheduler.max_num_batched_tokens
    before = sum(r.stats.step_id for r in ctx.server.stats_now() if r.stats)
    jobs = layout_jobs(ctx.workload)
    results = ctx.server.run(jobs)
    for job in jobs:
        ctx.checks.finished(job, results[job.key])
    _agree(ctx, jobs, results, "chunked prefill off")
    steps = sum(r.stats.step_id for r in ctx.server.stats_now() if r.stats) - before
    # Every token but the last sampled one has its K/V computed; a structured job ends with its
    # grammar, before max_tokens, so what counts is the tokens it produced.
    computed = sum(len(job.prompt) + max(len(results[job.key].token_ids) - 1, 0) for job in jobs)
    ctx.checks.details.update(steps=steps, computed_tokens=computed,
                              longest_prompt=max(len(j.prompt) for j in jobs))
    ctx.checks.expect(steps * budget >= computed,
                      f"{computed} tokens computed in {steps} steps: more than the budget of {budget} a step")


def _identical(ctx: CellContext, copies: int) -> None:
    twin = ctx.workload.twin_job()
    jobs = copies_of(twin, copies)
    before = sum(r.stats.num_preemptions for r in ctx.server.stats_now() if r.stats)
    results = ctx.server.run(jobs)
    bs, limit = ctx.workload.shape.block_size, len(twin.prompt) - 1
    for job in jobs:
        ctx.checks.finished(job, results[job.key])
        ctx.checks.agree(job.key, ctx.refs.get(twin.key), results[job.key], f"{twin.key} alone")
        hit = results[job.key].num_cached_tokens
        ctx.checks.expect(hit % bs == 0 and hit <= limit,
                          f"{job.key}: hit {hit} tokens: not whole pages up to {limit}")
    ctx.checks.details.update(num_cached_tokens=[g.num_cached_tokens for g in results.values()],
                              num_preemptions=sum(r.stats.num_preemptions for r in ctx.server.stats_now()
                                                  if r.stats) - before)


def _preemption(ctx: CellContext) -> None:
    jobs = layout_jobs(ctx.workload, exclude_longest=True)
    num_pages = ctx.server.config.cache.num_pages
    demand = sum(num_pages_of(job, ctx.workload.shape.block_size) for job in jobs)
    ctx.checks.details.update(num_pages=num_pages, pages_of_all_jobs=demand)
    ctx.checks.expect(demand > num_pages, f"the jobs need {demand} pages, the pool has {num_pages}: nothing "
                                          f"forces a preemption")
    before = sum(r.stats.num_preemptions for r in ctx.server.stats_now() if r.stats)
    results = ctx.server.run(jobs)
    for job in jobs:
        ctx.checks.finished(job, results[job.key])
    _agree(ctx, jobs, results, "a pool that needs no preemption")
    preemptions = sum(r.stats.num_preemptions for r in ctx.server.stats_now() if r.stats) - before
    ctx.checks.details["num_preemptions"] = preemptions
    ctx.checks.expect(preemptions > 0, f"num_preemptions stayed at {before} on a pool of {num_pages} pages "
                                       f"for jobs needing {demand}")
