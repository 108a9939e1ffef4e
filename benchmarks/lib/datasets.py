"""The load generator's workloads: what each request sends and how many tokens it asks for.

* random: prompts of random token ids, `input_len` long (+- range_ratio), asking for `output_len`
  tokens with ignore_eos, so every request costs exactly what it says (vLLM's random dataset).
* shared-prefix: `groups` system prompts of `system_len` tokens, each followed by
  `prompts_per_group` distinct questions of `question_len` tokens (SGLang's generated-shared-prefix);
  the order is shuffled so a group's requests interleave with the others'.
* multi-turn: conversations of `turns` user turns; each turn sends the whole history (earlier
  questions and the answers the server gave) plus a new question, so turn k's prompt extends
  turn k-1's: the prefix cache should hold everything but the newest part.

Prompts are token ids where the API allows it (exact lengths, no tokenizer in the loop); a
multi-turn turn is chat messages built from random words, since its history holds real replies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Stay below Qwen's special tokens (151643 on) so no prompt holds an accidental control token.
_MAX_ORDINARY_ID = 151_000
_WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]


@dataclass(frozen=True)
class RequestSpec:
    prompt_token_ids: list[int] | None  # None for a chat turn
    question: str | None  # the new user message of a multi-turn turn
    output_len: int
    conversation: int = -1  # multi-turn: which conversation; turns of one run in order
    turn: int = 0
    group: int = -1  # shared-prefix: which system prompt

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids) if self.prompt_token_ids is not None else 0


def _lengths(rng: np.random.Generator, n: int, mean: int, range_ratio: float) -> np.ndarray:
    low = max(1, int(mean * (1 - range_ratio)))
    high = max(low, int(mean * (1 + range_ratio)))
    return rng.integers(low, high + 1, n)


def random_dataset(
    num_prompts: int, input_len: int, output_len: int, range_ratio: float, seed: int
) -> list[RequestSpec]:
    rng = np.random.default_rng(seed)
    inputs = _lengths(rng, num_prompts, input_len, range_ratio)
    outputs = _lengths(rng, num_prompts, output_len, range_ratio)
    return [
        RequestSpec(rng.integers(0, _MAX_ORDINARY_ID, int(n)).tolist(), None, int(m))
        for n, m in zip(inputs, outputs)
    ]


def shared_prefix_dataset(
    groups: int, prompts_per_group: int, system_len: int, question_len: int, output_len: int, seed: int
) -> list[RequestSpec]:
    rng = np.random.default_rng([seed, 2])
    specs = []
    for group in range(groups):
        system = rng.integers(0, _MAX_ORDINARY_ID, system_len).tolist()
        for _ in range(prompts_per_group):
            question = rng.integers(0, _MAX_ORDINARY_ID, question_len).tolist()
            specs.append(RequestSpec(system + question, None, output_len, group=group))
    order = rng.permutation(len(specs))
    return [specs[i] for i in order]


def multi_turn_dataset(
    conversations: int, turns: int, question_words: int, output_len: int, seed: int
) -> list[RequestSpec]:
    rng = np.random.default_rng([seed, 3])
    specs = []
    for conversation in range(conversations):
        for turn in range(turns):
            words = rng.choice(_WORDS, question_words)
            specs.append(RequestSpec(None, " ".join(words), output_len, conversation, turn))
    return specs


def ids_as_words(token_ids: list[int]) -> str:
    """A text stand-in for a prompt of token ids, for servers and routers that take text only (the
    SGLang Model Gateway refuses token-id prompts): one word per id, so prompts that share a prefix
    of ids share a prefix of text. The server's token count differs from len(token_ids)."""
    return " ".join(_WORDS[t % len(_WORDS)] for t in token_ids)


def ideal_prefix_hit_rate(
    groups: int, prompts_per_group: int, system_len: int, question_len: int, block_size: int
) -> float:
    """The hit rate of a perfect page-granular cache on the shared-prefix workload: every request
    of a group but the first reuses the system prompt's whole pages."""
    hits = groups * (prompts_per_group - 1) * (system_len // block_size * block_size)
    return hits / (groups * prompts_per_group * (system_len + question_len))
