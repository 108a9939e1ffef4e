"""The cells that run on the reference server (DP1 TP1, prefix cache off, chunked prefill off).

They make the reference outputs every other server must reproduce (prompt lengths around a page
and at the context's end, each alone; batches of the same prompts) and check how requests end:
seeded sampling, stop strings, stop token ids, max_tokens and max_model_len.
"""

from __future__ import annotations

import dataclasses

from api.generation import Generation
from benchmarks.generalization.cell import Cell, CellContext
from benchmarks.generalization.structured_cells import structured_cell
from benchmarks.generalization.workload import SEED, Job, Workload, copies_of, greedy, sampled
from ipc.messages import ChatTurn


def reference_cells(workload: Workload) -> list[Cell]:
    shape = workload.shape
    cells = [_length_cell(n, workload) for n in shape.prompt_lengths]
    cells.append(Cell("batch 1 (each prompt alone)",
                      f"prompts {workload.alone_indices()} of the batch set alone: finish length with "
                      f"exactly max_tokens tokens; they are the reference of the batch cells", _alone))
    cells += [Cell(f"batch {size}", f"the first {size} batch prompts (mixed lengths and max_tokens) "
                   f"submitted at once reproduce their alone outputs and the previous batch's",
                   _batch_cell(size))
              for size in shape.batch_sizes if size > 1]
    cells += [
        Cell("prompt kinds", "a text prompt, the same as token ids, and a chat: the server's tokenization "
             "(echoed prompt_token_ids) matches num_prompt_tokens, and the ids given back as a prompt "
             "reproduce the output", _prompt_kinds),
        Cell("prefix cache off", "the prefix-cache cells' prompts twice, and one prompt twice at once: "
             "nothing cached, the second run reproduces the first, the hit counter stays 0", _cache_off),
        Cell("penalties", "greedy with repetition 1.3, presence 0.5 and frequency 0.5 penalties, alone: "
             "finish length with exactly max_tokens; other tokens than without them if the plain greedy run "
             "repeats a history token, the same tokens if it never does (penalties only lower history "
             "tokens); the reference of the layouts' penalties job", _penalties),
        Cell("seeded sampling", "temperature 1: the same seed twice alone gives the same tokens, twice in "
             "one batch too (and, float32, the same as alone); another seed gives other tokens; the "
             "reference of the layouts' seeded job", _seeded),
        Cell("stop string", "a string from the middle of a sampled text, and one spanning two greedy tokens: "
             "the text ends right before it, finish_reason stop, stop_reason the string", _stop_string),
        Cell("stop token id", "ignore_eos false and stop_token_ids set to a token of an earlier run (greedy, "
             "and seeded mid-sequence): the run ends at that token with finish_reason stop, stop_reason "
             "the id, the tokens before it unchanged", _stop_token),
        Cell("max_tokens", "ignore_eos false: finish length with exactly max_tokens tokens, the greedy "
             "tokens of ignore_eos true", _max_tokens),
        Cell("min_tokens", "the end token (and, with ignore_eos, a stop token id) favoured by a logit bias "
             "of +100 and min_tokens 5: five other tokens, then that one, finish stop", _min_tokens),
        Cell("max_model_len", "prompt + max_tokens == max_model_len: finish length with exactly max_tokens; "
             "one more token is refused (field max_tokens), a max_model_len prompt too (field prompt)",
             _max_model_len),
        structured_cell(),
    ]
    return cells


# --- prefill and decode at every prompt length ------------------------------------------------------


def _length_label(length: int, workload: Workload) -> str:
    bs, mml = workload.shape.block_size, workload.shape.max_model_len
    names = {1: "1", bs - 1: "block_size-1", bs: "block_size", bs + 1: "block_size+1",
             mml - 1: "max_model_len-1"}
    return names.get(length, str(length))


def _length_cell(length: int, workload: Workload) -> Cell:
    outputs = workload.length_outputs(length)

    def run(ctx: CellContext) -> None:
        jobs = [ctx.workload.length_job(length, m) for m in outputs]
        results = ctx.server.run_alone(jobs)
        for job in jobs:
            generation = results[job.key]
            if ctx.checks.finished(job, generation):
                ctx.refs[job.key] = generation
            ctx.checks.expect(generation.num_cached_tokens == 0, f"{job.key}: num_cached_tokens "
                              f"{generation.num_cached_tokens} with the cache off")
        longest = results[jobs[-1].key]
        for job in jobs[:-1]:  # max_tokens only cuts the greedy sequence short
            ctx.checks.agree(job.key, _first(longest, job.params.max_tokens), results[job.key],
                             f"the first {job.params.max_tokens} tokens of {jobs[-1].key}")

    label = _length_label(length, workload)
    return Cell(f"prefill+decode, prompt {length} ({label})" if label != str(length) else
                f"prefill+decode, prompt {length}",
                f"alone, max_tokens {', '.join(map(str, outputs))}: finish length with exactly max_tokens "
                f"tokens, num_prompt_tokens {length}, nothing cached"
                + ("; a shorter output is the start of the longest" if len(outputs) > 1 else ""), run)


def _first(generation: Generation, num_tokens: int) -> Generation:
    """The generation as if it had stopped at `num_tokens` by length."""
    def cut(values):
        return None if values is None else values[:num_tokens]
    return dataclasses.replace(generation, token_ids=generation.token_ids[:num_tokens],
                               finish_reason="length", logprobs=cut(generation.logprobs),
                               top_logprobs=cut(generation.top_logprobs), tokens=cut(generation.tokens))


# --- batches ----------------------------------------------------------------------------------------


def _alone(ctx: CellContext) -> None:
    jobs = [ctx.workload.batch[i] for i in ctx.workload.alone_indices()]
    for job, generation in zip(jobs, ctx.server.run_alone(jobs).values()):
        if ctx.checks.finished(job, generation):
            ctx.refs[job.key] = generation


def _batch_cell(size: int):
    def run(ctx: CellContext) -> None:
        jobs = ctx.workload.batch[:size]
        results = ctx.server.run(jobs)
        for job in jobs:
            ctx.checks.finished(job, results[job.key])
        alone = {k: g for k, g in results.items() if k in ctx.refs}
        ctx.checks.agree_all(alone, ctx.refs, "the same prompt alone")
        previous: dict[str, Generation] = ctx.shared.get("last_batch", {})
        ctx.checks.agree_all({k: g for k, g in results.items() if k in previous}, previous,
                             f"the batch of {len(previous)}")
        ctx.checks.details.update(compared_alone=len(alone),
                                  compared_previous_batch=len(previous.keys() & results.keys()))
        ctx.shared["last_batch"] = results
    return run


# --- prompt kinds ----------------------------------------------------------------------------------


def _prompt_kinds(ctx: CellContext) -> None:
    checks, out = ctx.checks, ctx.workload.shape.long_output
    params = greedy(out)
    text, chat = "The capital of France is", [ChatTurn("user", "Name three rivers.")]
    by_text, by_chat = ctx.server.client.generate([text, chat], params)
    for name, generation in (("text", by_text), ("chat", by_chat)):
        ids = generation.prompt_token_ids
        if not checks.expect(ids is not None and len(ids) == generation.num_prompt_tokens > 0,
                             f"{name}: prompt_token_ids {ids} do not match num_prompt_tokens "
                             f"{generation.num_prompt_tokens}"):
            continue
        job = Job(f"{name}-as-ids/out{out}", ids, params)
        checks.finished(job, generation)
        again = ctx.server.run([job])[job.key]
        checks.finished(job, again)
        checks.agree(job.key, generation, again, f"the {name} prompt")
    checks.details["num_prompt_tokens"] = {"text": by_text.num_prompt_tokens,
                                           "chat": by_chat.num_prompt_tokens}


# --- the prefix cache off ---------------------------------------------------------------------------


def cache_cell_jobs(ctx: CellContext) -> list[Job]:
    """The prompts of the prefix-cache cells beyond the probe: partial-page, next-turn and full-hit
    prompts (the first two continue probe outputs, so they exist once those have references)."""
    workload = ctx.workload
    source = ctx.refs.get(workload.shared_prefix_source().key)
    partial = workload.partial_jobs(source.token_ids) if source is not None else []
    turn_source = ctx.refs.get(workload.next_turn_source().key)
    turn = workload.next_turn_job(turn_source.token_ids) if turn_source is not None else None
    return [*partial, *([turn] if turn else []), *workload.full_hit_jobs(), workload.twin_job()]


def _cache_off(ctx: CellContext) -> None:
    checks = ctx.checks
    jobs = cache_cell_jobs(ctx)
    for prefix, source in (("partial-", ctx.workload.shared_prefix_source()),
                           ("turn2-", ctx.workload.next_turn_source())):
        checks.expect(any(j.key.startswith(prefix) for j in jobs),
                      f"no {prefix} prompt: {source.key} has no reference, or it does not fit")
    first = ctx.server.run(jobs)
    second = ctx.server.run(jobs)
    pair = ctx.server.run(copies_of(ctx.workload.twin_job()))
    for job in jobs:
        if checks.finished(job, first[job.key]):
            ctx.refs[job.key] = first[job.key]
        checks.agree(job.key, first[job.key], second[job.key], "its first run")
    twin = ctx.workload.twin_job()
    for key, generation in pair.items():
        checks.agree(key, ctx.refs.get(twin.key), generation, f"{twin.key} alone")
    for key, generation in [*first.items(), *second.items(), *pair.items()]:
        checks.expect(generation.num_cached_tokens == 0,
                      f"{key}: num_cached_tokens {generation.num_cached_tokens} with the cache off")
    hits = [r.stats.prefix_cache_hit_tokens for r in ctx.server.stats_now() if r.stats]
    checks.expect(sum(hits) == 0, f"prefix_cache_hit_tokens {hits} with the cache off")


# --- how requests end -------------------------------------------------------------------------------


def _penalties(ctx: CellContext) -> None:
    job = ctx.workload.penalty_job()
    generation = ctx.server.run([job])[job.key]
    if ctx.checks.finished(job, generation):
        ctx.refs[job.key] = generation
    plain = ctx.refs.get(ctx.workload.length_job(len(job.prompt), job.params.max_tokens).key)
    if plain is None:
        return
    # Every penalty only lowers tokens of the history (prompt and output so far). So the greedy tokens
    # must change if the plain greedy run repeats a history token, and must not change if it never does
    # (a random bf16 model rarely repeats: then this checks that no other token was touched).
    first_repeat = _first_repeat(list(job.prompt), plain.token_ids)
    if first_repeat is None:
        ctx.checks.expect(plain.token_ids == generation.token_ids,
                          f"{job.key}: the plain greedy run never repeats a history token, yet the "
                          f"penalties changed its tokens")
    else:
        ctx.checks.expect(plain.token_ids != generation.token_ids,
                          f"{job.key}: the plain greedy run repeats a history token at output "
                          f"{first_repeat}, yet the penalties left its tokens unchanged")
    ctx.checks.details["plain_first_repeat"] = first_repeat
    ctx.checks.details["distinct_tokens"] = {"with": len(set(generation.token_ids)),
                                             "without": len(set(plain.token_ids))}


def _first_repeat(prompt: list[int], output: list[int]) -> int | None:
    """Index of the first output token already in the prompt or the output before it, or None."""
    seen = set(prompt)
    for i, token in enumerate(output):
        if token in seen:
            return i
        seen.add(token)
    return None


def _seeded(ctx: CellContext) -> None:
    checks, workload = ctx.checks, ctx.workload
    out = workload.shape.long_output
    job, other = workload.seeded_job(SEED), workload.seeded_job(SEED + 1)
    first = ctx.server.run([job])[job.key]
    again = ctx.server.run([job])[job.key]
    batch = ctx.server.run([*copies_of(job), other])
    one, two = batch[f"{job.key}@1"], batch[f"{job.key}@2"]
    for key, generation in [(job.key, first), (job.key, again), (f"{job.key}@1", one), (f"{job.key}@2", two),
                            (other.key, batch[other.key])]:
        checks.finished(dataclasses.replace(job, key=key), generation)
    checks.expect(first.token_ids == again.token_ids,
                  f"seed {SEED} alone twice: {first.token_ids[:8]}... then {again.token_ids[:8]}...")
    checks.expect(one.token_ids == two.token_ids,
                  f"seed {SEED} twice in one batch: {one.token_ids[:8]}... and {two.token_ids[:8]}...")
    if checks.tolerance.exact:
        checks.expect(one.token_ids == first.token_ids, f"seed {SEED} in a batch {one.token_ids[:8]}... "
                                                        f"differs from alone {first.token_ids[:8]}...")
    checks.expect(batch[other.key].token_ids != first.token_ids,
                  f"seeds {SEED} and {SEED + 1} gave the same {out} tokens")
    if checks.passed:  # what the layouts' seeded job must reproduce: max_tokens only cuts it short
        short = workload.layout_seeded_job()
        ctx.refs[short.key] = _first(first, short.params.max_tokens)


def _usable(text: str) -> bool:
    return "\ufffd" not in text and text.strip() != ""


def _mid_text_stop(text: str) -> str | None:
    """A 3-character string whose first occurrence starts in the second half of `text`."""
    for start in range(len(text) // 2, len(text) - 3):
        candidate = text[start : start + 3]
        if _usable(candidate) and text.index(candidate) >= len(text) // 4:
            return candidate
    return None


def _stop_string(ctx: CellContext) -> None:
    checks, workload = ctx.checks, ctx.workload
    long_prompt = workload.shared_prefix_source().prompt
    out = workload.shape.long_output
    sampled_job = Job("stop-sampled", long_prompt, sampled(out, SEED))
    greedy_job = Job("stop-greedy", workload.by_length[workload.shape.block_size], greedy(out))
    full = ctx.server.run([sampled_job, greedy_job])
    cases = []
    text = full[sampled_job.key].text
    stop = _mid_text_stop(text)
    if checks.expect(stop is not None, f"{sampled_job.key}: no usable stop string in its text {text!r}"):
        cases.append((sampled_job, stop))
    tokens = full[greedy_job.key].tokens or []
    if len(tokens) >= 2 and _usable(tokens[0]) and _usable(tokens[1]):
        cases.append((greedy_job, tokens[0][-2:] + tokens[1][:2]))  # spans the first two tokens
    else:
        checks.details["greedy_spanning_stop"] = f"skipped: first tokens {tokens[:2]!r} have no usable text"
    stopped = ctx.server.run([dataclasses.replace(job, params=dataclasses.replace(job.params, stop=(s,)))
                              for job, s in cases])
    for job, stop in cases:
        whole, result = full[job.key], stopped[job.key]
        expected = whole.text[: whole.text.index(stop)]
        checks.expect(result.finish_reason == "stop" and result.stop_reason == stop,
                      f"{job.key}: finish {result.finish_reason!r} stop_reason {result.stop_reason!r}, "
                      f"expected 'stop' and {stop!r}")
        checks.expect(result.text == expected, f"{job.key}: text {result.text!r}, expected {expected!r} "
                                               f"(the text before {stop!r})")
        checks.expect(len(result.token_ids) <= len(whole.token_ids), f"{job.key}: {len(result.token_ids)} "
                      f"tokens, more than the {len(whole.token_ids)} unstopped")
    checks.details["stop_strings"] = {job.key: s for job, s in cases}


def _first_new_token(ids: list[int], start: int, eos: set[int]) -> int | None:
    """The first position >= start whose id neither occurs before it nor is an EOS id."""
    return next((k for k in range(start, len(ids)) if ids[k] not in ids[:k] and ids[k] not in eos), None)


def _stop_token(ctx: CellContext) -> None:
    checks, workload = ctx.checks, ctx.workload
    eos = set(ctx.server.config.model.generation.eos_token_ids)
    out = workload.shape.long_output
    prompt = workload.by_length[workload.shape.block_size - 1]
    greedy_job = Job("stoptoken-greedy", prompt, greedy(out))
    sampled_job = Job("stoptoken-sampled", prompt, sampled(out, SEED))
    full = ctx.server.run([greedy_job, sampled_job])
    cases = []
    for job, start in ((greedy_job, 0), (sampled_job, out // 2)):
        ids = full[job.key].token_ids
        if any(i in eos for i in ids[: start + 1]):
            checks.details[job.key] = "skipped: an EOS id comes first"
            continue
        # Greedy dummy weights repeat one token, so its first new token may be the very first one.
        position = _first_new_token(ids, min(start, len(ids) - 1), eos)
        if checks.expect(position is not None, f"{job.key}: no token in {ids} to stop at"):
            cases.append((job, position, ids[position]))
    stopped = ctx.server.run([dataclasses.replace(job, params=dataclasses.replace(
        job.params, ignore_eos=False, stop_token_ids=(token,))) for job, _, token in cases])
    for job, position, token in cases:
        result, ids = stopped[job.key], full[job.key].token_ids
        checks.expect(result.finish_reason == "stop" and result.stop_reason == token,
                      f"{job.key}: finish {result.finish_reason!r} stop_reason {result.stop_reason!r}, "
                      f"expected 'stop' and {token}")
        checks.expect(result.token_ids == ids[: position + 1],
                      f"{job.key}: tokens {result.token_ids}, expected {ids[: position + 1]} (ending at the "
                      f"stop token {token}, position {position})")
    checks.details["stop_positions"] = {job.key: position for job, position, _ in cases}


def _max_tokens(ctx: CellContext) -> None:
    checks, workload = ctx.checks, ctx.workload
    eos = set(ctx.server.config.model.generation.eos_token_ids)
    source = workload.shared_prefix_source()
    job = dataclasses.replace(source, params=dataclasses.replace(source.params, ignore_eos=False))
    result = ctx.server.run([job])[job.key]
    reference = ctx.refs.get(source.key)
    eos_at = next((i for i, t in enumerate(reference.token_ids) if t in eos), None) if reference else None
    if eos_at is None:
        checks.finished(job, result)
        checks.agree(job.key, reference, result, f"{source.key} with ignore_eos")
    else:  # the dummy weights reached an EOS id: the run must end there instead
        checks.details["eos_position"] = eos_at
        stopped_there = result.token_ids == reference.token_ids[: eos_at + 1]
        checks.expect(result.finish_reason == "stop" and stopped_there,
                      f"{job.key}: expected to stop at the EOS id at position {eos_at}, got finish "
                      f"{result.finish_reason!r} after {len(result.token_ids)} tokens")


def _min_tokens(ctx: CellContext) -> None:
    checks, workload = ctx.checks, ctx.workload
    end, least = ctx.server.config.model.generation.eos_token_ids[0], 5
    prompt = workload.by_length[workload.shape.block_size - 1]
    stop_id = 7  # an ordinary token
    jobs = [(Job("mintokens-eos", prompt, greedy(16, ignore_eos=False, min_tokens=least,
                                                 logit_bias=((end, 100.0),))), end),
            (Job("mintokens-stop-id", prompt, greedy(16, min_tokens=least, stop_token_ids=(stop_id,),
                                                     logit_bias=((stop_id, 100.0),))), stop_id)]
    results = ctx.server.run([job for job, _ in jobs])
    for job, favoured in jobs:
        ids, finish = results[job.key].token_ids, results[job.key].finish_reason
        checks.expect(finish == "stop" and len(ids) == least + 1 and ids[-1] == favoured
                      and favoured not in ids[:least],
                      f"{job.key}: {finish!r} after {ids}, expected {least} other tokens then {favoured}")


def _max_model_len(ctx: CellContext) -> None:
    checks, workload = ctx.checks, ctx.workload
    mml = workload.shape.max_model_len
    max_tokens = min(8, workload.shape.long_output)
    prompt = workload.fresh(mml - max_tokens)
    fits = Job(f"mml-prompt{len(prompt)}/out{max_tokens}", prompt, greedy(max_tokens))
    over = Job(f"mml-prompt{len(prompt) + 1}/out{max_tokens}", prompt + [7], greedy(max_tokens))
    whole = Job(f"mml-prompt{mml}/out1", workload.fresh(mml), greedy(1))
    results = ctx.server.run([fits, over, whole])
    checks.finished(fits, results[fits.key])
    for job, field in ((over, "max_tokens"), (whole, "prompt")):
        refused = results[job.key].refused
        checks.expect(refused is not None and refused.field == field,
                      f"{job.key}: expected a refusal naming the field {field!r}, got "
                      f"{refused if refused is not None else results[job.key].finish_reason!r}")
