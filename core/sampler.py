"""Sampler: turns one step's logits into the next token of every request that samples.

The executor builds `SamplingTensors.from_plan(plan, plan.sampled_rows, device)` once per step and
calls `Sampler()(logits, st)` with the logits of those rows. Everything is batched torch ops on the
logits' device; the only host work is flattening the plan's arrays and a few flags that let the
common paths (all greedy, no penalties, no logprobs) skip whole stages.

Per row, in this order:
  1. logprobs of the raw model distribution (log_softmax of the logits as given), as vLLM reports;
  2. penalties: repetition (HF-style, prompt + output tokens), presence and frequency (OpenAI-style,
     output tokens only);
  3. temperature 0 -> argmax (ties go to the lowest id); otherwise divide by the temperature, drop
     tokens below min_p * max prob, keep the top_k, keep the top_p nucleus, and sample with noise
     that depends only on (seed, output_pos, token id), see `exponential_noise`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
import torch

from core.host_to_device import to_device
from core.plan import StepPlan

_MASK32 = 0xFFFFFFFF
# Bound on the [rows, vocab] int64 temporaries of the noise hash: ~128 MiB each at 2^24 elements.
_NOISE_CHUNK_ELEMS = 1 << 24


@dataclass(frozen=True, eq=False)
class SamplingTensors:
    """Sampling settings of the N rows that sample this step, on the device, plus host-side flags."""

    temperature: torch.Tensor  # float32 [N]  0 = greedy
    top_p: torch.Tensor  # float32 [N]  1 = off
    top_k: torch.Tensor  # int64 [N]  0 = off (the plan's -1 is mapped to 0)
    min_p: torch.Tensor  # float32 [N]  0 = off
    seed: torch.Tensor  # int64 [N]
    output_pos: torch.Tensor  # int64 [N]  tokens generated so far: the noise index of this draw
    repetition_penalty: torch.Tensor  # float32 [N]
    presence_penalty: torch.Tensor  # float32 [N]
    frequency_penalty: torch.Tensor  # float32 [N]
    num_logprobs: torch.Tensor  # int32 [N]  -1 = none, 0 = sampled token only, K = also the top K
    random_rows: torch.Tensor  # int64 [R]  the rows with temperature > 0
    # Penalty history flattened to one entry per (row, token occurrence), only for rows with penalties.
    history_rows: torch.Tensor  # int64 [H]  row in 0..N-1
    history_ids: torch.Tensor  # int64 [H]  token id
    history_is_output: torch.Tensor  # bool [H]  False = prompt token (repetition penalty only)
    # Host-side flags, computed once so the sampler never syncs to decide what to skip.
    all_greedy: bool
    all_random: bool  # no row is greedy
    any_penalties: bool  # some row has a non-default penalty and a non-empty history
    any_top_k: bool  # among the rows that sample randomly
    any_top_p: bool
    any_min_p: bool
    max_num_logprobs: int  # -1 when no row wants logprobs (or N = 0)
    max_history_id: int  # -1 when the flattened history is empty

    def __post_init__(self) -> None:
        n = self.num_rows
        for name in ("top_p", "top_k", "min_p", "seed", "output_pos", "repetition_penalty",
                     "presence_penalty", "frequency_penalty", "num_logprobs"):
            shape = tuple(getattr(self, name).shape)
            if shape != (n,):
                raise ValueError(f"SamplingTensors.{name} has shape {shape}, expected ({n},)")
        h = self.history_ids.shape[0]
        for name in ("history_rows", "history_is_output"):
            shape = tuple(getattr(self, name).shape)
            if shape != (h,):
                raise ValueError(f"SamplingTensors.{name} has shape {shape}, expected ({h},)")

    @property
    def num_rows(self) -> int:
        return self.temperature.shape[0]

    @classmethod
    def from_plan(cls, plan: StepPlan, rows: np.ndarray, device: torch.device | str) -> SamplingTensors:
        """Settings of the plan's requests `rows` (usually `plan.sampled_rows`), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        device = torch.device(device)
        temperature = plan.temperature[rows]
        top_p, min_p = plan.top_p[rows], plan.min_p[rows]
        top_k = np.maximum(plan.top_k[rows], 0)
        repetition = plan.repetition_penalty[rows]
        presence, frequency = plan.presence_penalty[rows], plan.frequency_penalty[rows]
        num_logprobs = plan.num_logprobs[rows]

        has_penalty = (repetition != 1.0) | (presence != 0.0) | (frequency != 0.0)
        history_rows, history_ids, history_is_output = _flatten_history(plan, rows, has_penalty)
        if len(history_ids) and history_ids.min() < 0:
            bad = int(np.flatnonzero(history_ids < 0)[0])
            slot = int(plan.req_slot[rows[history_rows[bad]]])
            raise ValueError(f"request in slot {slot} has history token id {int(history_ids[bad])} < 0")

        random = temperature != 0.0

        # Two host-to-device copies for the per-row settings (one float32, one int64 block), and one
        # per non-empty ragged array, each staged through pinned memory: none waits for the GPU queue.
        floats = to_device(np.stack([temperature, top_p, min_p, repetition, presence, frequency])
                           .astype(np.float32, copy=False), device)
        ints = to_device(np.stack([top_k, plan.seed[rows], plan.output_pos[rows], num_logprobs])
                         .astype(np.int64, copy=False), device)

        def put(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            if not len(array):
                return torch.empty(0, dtype=dtype, device=device)
            return to_device(array, device, dtype)

        return cls(
            temperature=floats[0], top_p=floats[1], min_p=floats[2], repetition_penalty=floats[3],
            presence_penalty=floats[4], frequency_penalty=floats[5],
            top_k=ints[0], seed=ints[1], output_pos=ints[2], num_logprobs=ints[3].to(torch.int32),
            random_rows=put(np.flatnonzero(random), torch.int64),
            history_rows=put(history_rows, torch.int64),
            history_ids=put(history_ids, torch.int64),
            history_is_output=put(history_is_output, torch.bool),
            all_greedy=not random.any(),
            all_random=bool(random.all()),
            any_penalties=len(history_ids) > 0,
            any_top_k=bool((random & (top_k > 0)).any()),
            any_top_p=bool((random & (top_p < 1.0)).any()),
            any_min_p=bool((random & (min_p > 0.0)).any()),
            max_num_logprobs=int(num_logprobs.max()) if len(rows) else -1,
            max_history_id=int(history_ids.max()) if len(history_ids) else -1,
        )


def _flatten_history(
    plan: StepPlan, rows: np.ndarray, take: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, token id, is_output) per history entry of the rows where `take`, without a Python loop."""
    starts = plan.history_start[rows].astype(np.int64)
    lengths = np.where(take, plan.history_start[rows + 1] - starts, 0)
    # offset of each entry inside its own request's history: a ragged arange
    offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    history_rows = np.repeat(np.arange(len(rows)), lengths)
    history_ids = plan.history_ids[np.repeat(starts, lengths) + offsets]
    is_output = offsets >= np.repeat(plan.history_prompt_len[rows], lengths)
    return history_rows, history_ids, is_output


class SamplerOutput(NamedTuple):
    token_ids: torch.Tensor  # int32 [N]
    # The logprob fields cover every row (rows that asked for fewer or none just ignore theirs) and
    # are None when no row asked: sampled_logprobs when every num_logprobs is -1, the top ones when
    # the largest num_logprobs K is below 1.
    sampled_logprobs: torch.Tensor | None  # float32 [N]
    top_token_ids: torch.Tensor | None  # int32 [N, K]  most probable first
    top_logprobs: torch.Tensor | None  # float32 [N, K]


class Sampler:
    """Stateless: `Sampler()(logits, st)`; a class so the executor holds one policy object."""

    def __call__(self, logits: torch.Tensor, st: SamplingTensors) -> SamplerOutput:
        if logits.dim() != 2 or logits.shape[0] != st.num_rows:
            raise ValueError(f"logits have shape {tuple(logits.shape)}, expected ({st.num_rows}, vocab)")
        vocab_size = logits.shape[1]
        if st.max_history_id >= vocab_size:
            raise ValueError(
                f"penalty history holds token id {st.max_history_id}, the vocabulary has {vocab_size}"
            )
        logits = logits.float()
        raw_logprobs = torch.log_softmax(logits, dim=-1) if st.max_num_logprobs >= 0 else None
        if st.any_penalties:
            logits = apply_penalties(logits, st)
        token_ids = _sample(logits, st)
        return _gather_logprobs(raw_logprobs, token_ids, st.max_num_logprobs)


def apply_penalties(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Penalized copy of `logits` [N, V]; rows without history come back unchanged."""
    num_rows, vocab_size = logits.shape
    index = (st.history_rows, st.history_ids)
    seen = torch.zeros((num_rows, vocab_size), dtype=torch.bool, device=logits.device)
    seen.index_put_(index, torch.ones_like(st.history_is_output))
    repetition = st.repetition_penalty[:, None]
    logits = torch.where(seen, torch.where(logits > 0, logits / repetition, logits * repetition), logits)
    # Prompt entries add 0, so the output counts need no filtering (which would sync on the device).
    counts = torch.zeros((num_rows, vocab_size), dtype=torch.float32, device=logits.device)
    counts.index_put_(index, st.history_is_output.float(), accumulate=True)
    return logits - st.frequency_penalty[:, None] * counts - st.presence_penalty[:, None] * (counts > 0)


def _sample(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    greedy = logits.argmax(dim=-1)  # first maximum on CPU and CUDA: ties go to the lowest id
    if st.all_greedy:
        return greedy.to(torch.int32)
    if st.all_random:
        return _sample_random(logits, st).to(torch.int32)
    # Noise over the whole vocabulary is the costly part: draw it for the random rows only.
    rows = st.random_rows
    sampled = greedy.clone()
    sampled[rows] = _sample_random(logits[rows], _rows_of(st, rows))
    return sampled.to(torch.int32)


def _sample_random(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Sampled token ids [N] of rows that all have a temperature above 0."""
    probs = torch.softmax(logits / st.temperature[:, None], dim=-1)  # [N, V]
    if st.any_min_p:
        threshold = st.min_p[:, None] * probs.amax(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < threshold, 0.0)
    if st.any_top_k or st.any_top_p:
        probs = _apply_top_k_top_p(probs, st)
    # Exponential race: argmax(p_i / E_i) with E_i ~ Exp(1) picks token i with probability
    # p_i / sum(p), so the probabilities need no renormalization after masking.
    return (probs / exponential_noise(st.seed, st.output_pos, logits.shape[1])).argmax(dim=-1)


def _rows_of(st: SamplingTensors, rows: torch.Tensor) -> SamplingTensors:
    """The per-row settings of `rows` only (the penalty history is not needed after penalties)."""
    subset = {name: getattr(st, name)[rows] for name in _PER_ROW_FIELDS}
    return replace(st, **subset, all_greedy=False, all_random=True,
                   random_rows=torch.arange(rows.shape[0], device=rows.device))


_PER_ROW_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "output_pos", "repetition_penalty",
                   "presence_penalty", "frequency_penalty", "num_logprobs")


def _apply_top_k_top_p(probs: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Zero the tokens outside each row's top_k and then outside its top_p nucleus; one sort."""
    vocab_size = probs.shape[1]
    # stable: among equal probabilities the lower id ranks first, the same on every device
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True, stable=True)  # [N, V]
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if st.any_top_k:
        k = torch.where(st.top_k > 0, st.top_k, vocab_size)
        keep = torch.arange(vocab_size, device=probs.device)[None, :] < k[:, None]
        sorted_probs = sorted_probs.masked_fill(~keep, 0.0)
    if st.any_top_p:
        # The nucleus is taken over what min_p and top_k left, renormalized. A token stays while the
        # mass before it is below top_p, so the top token always stays and the set is the smallest
        # one whose mass reaches top_p. Rows with top_p = 1 skip the test: float cumsum error could
        # otherwise cut their tail.
        cumulative = sorted_probs.cumsum(dim=-1)
        mass_before = cumulative - sorted_probs
        in_nucleus = mass_before < st.top_p[:, None] * cumulative[:, -1:]
        keep = keep & (in_nucleus | (st.top_p[:, None] >= 1.0))
    keep_by_id = torch.empty_like(keep).scatter_(-1, sorted_ids, keep)
    return probs.masked_fill(~keep_by_id, 0.0)


def _gather_logprobs(
    raw_logprobs: torch.Tensor | None, token_ids: torch.Tensor, max_num_logprobs: int
) -> SamplerOutput:
    if raw_logprobs is None:
        return SamplerOutput(token_ids, None, None, None)
    sampled = raw_logprobs.gather(-1, token_ids.long()[:, None]).squeeze(-1)
    if max_num_logprobs < 1:
        return SamplerOutput(token_ids, sampled, None, None)
    top_logprobs, top_ids = raw_logprobs.topk(min(max_num_logprobs, raw_logprobs.shape[1]), dim=-1)
    return SamplerOutput(token_ids, sampled, top_ids.to(torch.int32), top_logprobs)


# --- seeded noise ---------------------------------------------------------------------------------
#
# torch's generators draw a whole batch from one stream, so a request's noise would depend on its
# row, on the batch size and on the device's RNG. Instead every uniform is a pure function of
# (seed, output_pos, token id): a counter-based hash. The same request therefore draws the same
# noise alone or in any batch, in any row, on CPU or GPU, and a replayed request repeats itself.
# The hash is murmur3's 32-bit finalizer on int64 tensors holding values in [0, 2^32). A 32-bit
# product can reach 2^64 and overflow int64 (undefined in C++, so CPU and CUDA need not agree), so
# `_mul32` multiplies by 16-bit halves of the constant: every intermediate stays below 2^49.
# The integer part is bit-exact everywhere; -log is taken in float64, where CPU and CUDA agree to
# well below float32 resolution. The final token can still differ across devices if the model's
# logits (hence the probabilities) differ, which is the model's business, not the sampler's.


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """x * constant mod 2^32, for x in [0, 2^32) held in int64, without any product reaching 2^63."""
    low = x * (constant & 0xFFFF)  # < 2^48
    high = (x * (constant >> 16)) & 0xFFFF  # only its low 16 bits survive the shift by 16
    return (low + (high << 16)) & _MASK32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's finalizer: a bijection of [0, 2^32) with full avalanche."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def exponential_noise(seed: torch.Tensor, output_pos: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Exp(1) noise [N, V] float32, entry (i, v) a pure function of (seed[i], output_pos[i], v)."""
    device = seed.device
    seed_low, seed_high = seed & _MASK32, (seed >> 32) & _MASK32  # two's complement halves
    # For a fixed seed, output_pos -> key_a is a bijection: different positions never share a key.
    key_a = _fmix32(seed_low ^ _fmix32(seed_high ^ _fmix32((output_pos & _MASK32) ^ 0x9E3779B9)))
    key_b = _fmix32(key_a ^ _fmix32(seed_high ^ 0x7F4A7C15))
    token_hash = _fmix32(torch.arange(vocab_size, device=device, dtype=torch.int64) ^ 0x2545F491)
    noise = torch.empty((seed.shape[0], vocab_size), dtype=torch.float32, device=device)
    rows_per_chunk = max(1, _NOISE_CHUNK_ELEMS // max(vocab_size, 1))
    for start in range(0, seed.shape[0], rows_per_chunk):
        rows = slice(start, start + rows_per_chunk)
        h = _fmix32(token_hash[None, :] ^ key_a[rows, None])  # [rows, V], distinct per token
        h = _fmix32((h + key_b[rows, None]) & _MASK32)
        uniform = (h.to(torch.float64) + 0.5) * 2.0**-32  # in (0, 1), never 0 or 1
        noise[rows] = -torch.log(uniform)
    return noise
