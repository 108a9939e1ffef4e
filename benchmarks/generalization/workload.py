"""The requests of the generalization matrix: deterministic prompts, their jobs and cache expectations.

Every prompt is random token ids from one seeded generator (ids below 150,000, so no special
tokens), drawn independently, so two prompts share a prefix only where a cell builds one on
purpose. A `Job` is one request: a key that names it across servers (the same key on two servers
means the same prompt and parameters, so their outputs must agree), the prompt and its parameters.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from core.sampling_params import SamplingParams
from core.structured.specs import choice_spec, compact_spec, grammar_spec, json_schema_spec, tool_calls_spec

# The near-tie rule looks for both diverging tokens among each run's top logprobs: 100 (the matrix's
# servers run with --max-logprobs 100), because on the dummy weights' flat distributions the 20th
# token can sit within the FP8 tolerance of the best, so a token outside the top 20 proved nothing
# (four FP8 cells failed so on an H100).
TOP_LOGPROBS = 100
SEED = 1234  # of the seeded-sampling jobs
MAX_TOKEN_ID = 150_000
# What the structured-output jobs ask for: every string, array and gap bounded, so even a model
# with random weights reaches the end.
STRUCTURED_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "kind": {"enum": ["a", "b", None, 3]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
}, "required": ["name", "inner"]}
STRUCTURED_TOOL = {"name": "lookup", "parameters": {"type": "object", "properties": {
    "key": {"type": "string", "maxLength": 6}, "exact": {"type": "boolean"}}, "required": ["key", "exact"]}}
STRUCTURED_CHOICES = ("alpha", "beta", "beta gamma")
# A GBNF grammar (guided_grammar) whose rule calls are followed by more text (frames pushed and
# popped), and the regular expression that says the same, to check its outputs independently.
STRUCTURED_GRAMMAR = '''root ::= "SELECT " cols " FROM " table (" WHERE " cond)? ";"
cols ::= col (", " col){0,2}
col ::= "id" | "name" | "age"
table ::= "users" | "orders"
cond ::= col " = " [0-9]{1,3}'''
STRUCTURED_GRAMMAR_TEXT = (r"SELECT (id|name|age)(, (id|name|age)){0,2} FROM (users|orders)"
                           r"( WHERE (id|name|age) = [0-9]{1,3})?;")
STRUCTURED_MAX_TOKENS = 256


@dataclass(frozen=True)
class Job:
    key: str  # "len17/out64": the same key on every server means the same request
    prompt: list[int]
    params: SamplingParams


def copies_of(job: Job, count: int = 2) -> list[Job]:
    """The same request `count` times under keys of their own, to be submitted at once."""
    return [dataclasses.replace(job, key=f"{job.key}@{copy}") for copy in range(1, count + 1)]


def greedy(max_tokens: int, **overrides) -> SamplingParams:
    """Greedy, EOS ignored (so the count is exact), with the logprobs the comparison needs."""
    fields = dict(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=TOP_LOGPROBS)
    return SamplingParams(**{**fields, **overrides})


def sampled(max_tokens: int, seed: int, **overrides) -> SamplingParams:
    """Temperature 1 over the whole vocabulary with a seed, EOS ignored."""
    fields = dict(max_tokens=max_tokens, temperature=1.0, top_p=1.0, top_k=0, seed=seed, ignore_eos=True,
                  logprobs=TOP_LOGPROBS)
    return SamplingParams(**{**fields, **overrides})


@dataclass(frozen=True)
class Shape:
    """What the matrix covers; the cpu subset is a smaller Shape of the same cells."""

    block_size: int
    max_model_len: int
    prompt_lengths: tuple[int, ...]  # the prefill/decode cells, each alone
    output_lengths: tuple[int, ...]  # max_tokens of those cells; the last is the "long" output
    batch_sizes: tuple[int, ...]  # 1 = each prompt alone, the reference of the larger ones
    batch_prompt_lengths: tuple[int, ...]  # what the batch prompts are drawn from

    @property
    def long_output(self) -> int:
        return max(self.output_lengths)


def make_shape(subset: str, block_size: int, max_model_len: int) -> Shape:
    bs = block_size
    long_prompt = 100 if subset == "cpu" else 1000
    # The cpu subset's long output still spans pages (block_size 16) at half the decode steps: a tiny
    # model's step there is mostly its 151,936-row lm_head, memory-bound on a small CPU.
    output_lengths = (1, 2, 32 if subset == "cpu" else 64)
    lengths = sorted({n for n in (1, bs - 1, bs, bs + 1, long_prompt, max_model_len - 1)
                      if 1 <= n < max_model_len})
    batch_lengths = tuple(sorted({n for n in (1, bs - 1, bs, bs + 1, 2 * bs + 1, 40, long_prompt)
                                  if 1 <= n <= max_model_len - max(output_lengths)}))
    return Shape(bs, max_model_len, tuple(lengths), output_lengths,
                 (1, 7) if subset == "cpu" else (1, 7, 64, 256), batch_lengths)


class Workload:
    """Every prompt the matrix sends, drawn once from `seed`."""

    def __init__(self, shape: Shape, seed: int = 0) -> None:
        self.shape = shape
        self._rng = np.random.default_rng(seed)
        bs, out = shape.block_size, shape.long_output
        self.by_length = {n: self.fresh(n) for n in shape.prompt_lengths}
        num_batch = max(shape.batch_sizes)
        self.batch = [Job(f"batch{i}/out{m}", self.fresh(n), greedy(m)) for i, (n, m) in enumerate(zip(
            self._rng.choice(shape.batch_prompt_lengths, num_batch).tolist(),
            self._rng.choice(shape.output_lengths, num_batch).tolist()))]
        # Prompts of the full-prompt-hit cell: P = k*bs + 1 hits all but its last token, P = k*bs all
        # but its last page; one more is sent twice at once.
        self.full_hit = {n: self.fresh(n) for n in (bs + 1, 2 * bs, 2 * bs + 1)
                         if n + out <= shape.max_model_len}
        self.concurrent_twin = self.fresh(2 * bs + 1)
        self.fresh_tail = self.fresh(bs + 3)  # what follows a shared prefix in the partial-page cell

    def fresh(self, length: int) -> list[int]:
        return self._rng.integers(0, MAX_TOKEN_ID, length).tolist()

    # --- jobs -------------------------------------------------------------------------------------

    def length_job(self, length: int, max_tokens: int) -> Job:
        return Job(f"len{length}/out{max_tokens}", self.by_length[length], greedy(max_tokens))

    def length_outputs(self, length: int) -> list[int]:
        """max_tokens of a length cell: every output length that fits, or just 1 (max_model_len - 1)."""
        fits = [m for m in self.shape.output_lengths if length + m <= self.shape.max_model_len]
        return fits or [1]

    def probe(self, exclude_longest: bool = False) -> list[Job]:
        """One job per prompt length at its longest output: what other layouts must reproduce."""
        lengths = self.shape.prompt_lengths
        if exclude_longest:
            lengths = [n for n in lengths if n < self.shape.max_model_len - 1]
        return [self.length_job(n, self.length_outputs(n)[-1]) for n in lengths]

    def penalty_job(self) -> Job:
        """Greedy with repetition, presence and frequency penalties: the history (prompt and output so
        far) must survive batching, chunking, preemption and the DP/TP layouts."""
        n, out = self.shape.block_size + 1, self.shape.long_output
        params = greedy(out, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5)
        return Job(f"penalties-len{n}/out{out}", self.by_length[n], params)

    def seeded_job(self, seed: int = SEED, max_tokens: int | None = None) -> Job:
        """Seeded sampling: the noise depends on (seed, output position, token id) only, so batching,
        chunking, preemption (recompute) and the layouts must not change the tokens."""
        n, out = self.shape.block_size + 1, max_tokens or self.shape.long_output
        return Job(f"seed{seed}-len{n}/out{out}", self.by_length[n], sampled(out, seed))

    def layout_seeded_job(self) -> Job:
        """The seeded job the layouts run: short, since while one request samples, every row of a step
        pays for the sampling noise."""
        return self.seeded_job(max_tokens=min(16, self.shape.long_output))

    def structured_jobs(self) -> list[Job]:
        """A JSON schema greedy and seeded, tool calls, a choice, compact JSON (no whitespace between
        its tokens, seeded) and a GBNF grammar: each ends when its grammar does (EOS allowed), and must
        reproduce under batching, chunking, preemption and the layouts."""
        n = self.shape.block_size + 1
        out = min(STRUCTURED_MAX_TOKENS, self.shape.max_model_len - n)
        schema, tools = json_schema_spec(STRUCTURED_SCHEMA), tool_calls_spec([STRUCTURED_TOOL], max_calls=2)
        grammar = grammar_spec(STRUCTURED_GRAMMAR)
        specs = [("schema", greedy(out, ignore_eos=False, structured_output=schema)),
                 ("schema-seeded", sampled(out, SEED, ignore_eos=False, structured_output=schema)),
                 ("tools", greedy(out, ignore_eos=False, structured_output=tools)),
                 ("choice", greedy(out, ignore_eos=False, structured_output=choice_spec(STRUCTURED_CHOICES))),
                 ("schema-compact",
                  sampled(out, SEED + 1, ignore_eos=False, structured_output=compact_spec(schema))),
                 ("grammar", greedy(out, ignore_eos=False, structured_output=grammar))]
        return [Job(f"structured-{name}-len{n}", self.by_length[n], params) for name, params in specs]

    def alone_indices(self) -> list[int]:
        """Batch prompts also run alone: the first 7 and a few spread over the largest batch."""
        num = len(self.batch)
        return sorted({*range(min(7, num)), *(i for i in (31, 63, 127, 255) if i < num)})

    def shared_prefix_source(self) -> Job:
        """The probe job whose prompt the partial-page cell shares a prefix of: the longest below
        max_model_len - 1, so its output is long too."""
        n = max(n for n in self.shape.prompt_lengths if n < self.shape.max_model_len - 1)
        return self.length_job(n, self.length_outputs(n)[-1])

    def partial_jobs(self, source_output: list[int]) -> list[Job]:
        """Prompts that share a prefix ending mid-page with the source job: one inside its prompt,
        one reaching into the tokens it generated (`source_output`, the reference's)."""
        bs, source = self.shape.block_size, self.shared_prefix_source()
        out = self.shape.long_output
        jobs = []
        cut = 3 * bs + bs // 2
        if cut < len(source.prompt):
            prompt = source.prompt[:cut] + self.fresh_tail
            jobs.append(Job(f"partial-prompt{cut}/out{out}", prompt, greedy(out)))
        into = (bs // 2 - len(source.prompt)) % bs or bs  # generated tokens so the prefix ends mid-page
        if into < len(source_output):
            shared = source.prompt + source_output[:into]
            if len(shared) + len(self.fresh_tail) + out <= self.shape.max_model_len:
                prompt = shared + self.fresh_tail
                jobs.append(Job(f"partial-output{len(shared)}/out{out}", prompt, greedy(out)))
        return jobs

    def next_turn_source(self) -> Job:
        """The probe job a next turn continues: one whose prompt and output fill whole pages, so
        its last page ends with the one token that has no KV (the last sampled), if there is one."""
        bs = self.shape.block_size
        probe = self.probe(exclude_longest=True)
        whole = [j for j in probe if (len(j.prompt) + j.params.max_tokens) % bs == 0]
        return whole[0] if whole else self.shared_prefix_source()

    def next_turn_job(self, source_output: list[int]) -> Job | None:
        """A prompt that continues the source: its prompt, all of `source_output`, then new tokens."""
        source, out = self.next_turn_source(), self.shape.long_output
        prompt = source.prompt + source_output + self.fresh_tail
        if len(prompt) + out > self.shape.max_model_len:
            return None
        return Job(f"turn2-of-len{len(source.prompt)}/out{out}", prompt, greedy(out))

    def full_hit_jobs(self) -> list[Job]:
        out = self.shape.long_output
        return [Job(f"full{n}/out{out}", prompt, greedy(out)) for n, prompt in self.full_hit.items()]

    def twin_job(self) -> Job:
        return Job(f"twin{len(self.concurrent_twin)}/out{self.shape.long_output}", self.concurrent_twin,
                   greedy(self.shape.long_output))


def num_pages_of(job: Job, block_size: int) -> int:
    """KV pages the job holds at its end: every token but the last sampled one has KV."""
    return -(-(len(job.prompt) + job.params.max_tokens - 1) // block_size)


def expected_cached_tokens(prompt: list[int], cached: list[list[int]], block_size: int) -> int:
    """The prefix-cache hit of `prompt` given the token sequences whose KV the cache holds: the
    longest common prefix with any of them, cut to whole pages, over all but the prompt's last token
    (a full hit still computes the last token, so its forward yields the first output)."""
    best = max((common_prefix_len(prompt[:-1], seq) for seq in cached), default=0)
    return best // block_size * block_size


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n
