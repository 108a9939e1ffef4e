"""Specifications of core/execution/sampler.py, on CPU with small vocabularies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.execution.sampler import Sampler, SamplingTensors, apply_penalties
from core.execution.sampling_noise import (
    _fmix32,
    _mul32,
    _noise_at_int64,
    exponential_noise,
    noise_at,
    noise_keys,
)
from core.plan import StepPlan
from core.sampling_params import sampling_rows

History = list[tuple[list[int], list[int]]]


def make_plan(num_reqs: int, history: History | None = None, logits_index=None, output_pos=0,
              bias: list[dict[int, float]] | None = None, **sampling) -> StepPlan:
    """A decode step of `num_reqs` requests; sampling columns broadcast from scalars or per-request lists
    (the others at SamplingParams' defaults).

    `history` holds one (prompt ids, output ids) pair per request; `bias` one {token id: bias} each.
    """
    history = history or [([], [])] * num_reqs
    bias = bias or [{}] * num_reqs
    lengths = [len(prompt) + len(output) for prompt, output in history]
    ids = [token for prompt, output in history for token in prompt + output]
    return StepPlan(
        step_id=0,
        replica=0,
        query_start=np.arange(num_reqs + 1, dtype=np.int32),
        seq_lens=np.ones(num_reqs, dtype=np.int32),
        block_table=np.zeros((num_reqs, 1), dtype=np.int32),
        logits_index=np.asarray(np.arange(num_reqs) if logits_index is None else logits_index, np.int32),
        sampling=sampling_rows(num_reqs, **sampling),
        output_pos=np.broadcast_to(np.asarray(output_pos, np.int32), (num_reqs,)).copy(),
        history_start=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
        history_prompt_len=np.array([len(prompt) for prompt, _ in history], dtype=np.int32),
        history_ids=np.array(ids, dtype=np.int32),
        bias_start=np.concatenate([[0], np.cumsum([len(b) for b in bias])]).astype(np.int32),
        bias_ids=np.array([t for b in bias for t in b], dtype=np.int32),
        bias_values=np.array([v for b in bias for v in b.values()], dtype=np.float32),
        input_ids=np.zeros(num_reqs, dtype=np.int32),
        positions=np.zeros(num_reqs, dtype=np.int32),
        kv_index=np.zeros(num_reqs, dtype=np.int64),
    )


def sample(logits: torch.Tensor, history=None, bias=None, **sampling):
    plan = make_plan(logits.shape[0], history, bias=bias, **sampling)
    return Sampler()(logits, SamplingTensors.from_plan(plan, plan.sampled_rows, "cpu"))


def repeated(probs: list[float], num_rows: int) -> torch.Tensor:
    """`num_rows` copies of the logits of `probs`, to sample once per row with different seeds."""
    return torch.tensor(probs, dtype=torch.float32).log().expand(num_rows, -1).contiguous()


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> np.ndarray:
    return np.bincount(token_ids.numpy(), minlength=vocab_size)


def test_temperature_zero_is_argmax_with_ties_to_the_lowest_id():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    logits[5] = 0.0
    logits[5, [7, 3, 30]] = 4.0
    out = sample(logits, temperature=0.0, seed=np.arange(6), top_k=5, top_p=0.5)
    expected = logits.argmax(dim=-1).to(torch.int32)
    assert out.token_ids.dtype == torch.int32
    assert torch.equal(out.token_ids, expected)
    assert out.token_ids[5] == 3


def test_top_k_one_equals_greedy_for_every_seed():
    logits = torch.randn(1, 100, generator=torch.Generator().manual_seed(2)).expand(500, -1).contiguous()
    out = sample(logits, temperature=1.5, top_k=1, seed=np.arange(500))
    assert (out.token_ids == logits[0].argmax()).all()


def test_top_k_samples_only_and_all_of_the_k_most_probable():
    probs = [0.05, 0.3, 0.1, 0.25, 0.2, 0.1]
    out = sample(repeated(probs, 2000), top_k=3, seed=np.arange(2000))
    assert set(np.flatnonzero(token_counts(out.token_ids, 6))) == {1, 3, 4}


def test_top_p_samples_only_and_all_of_the_smallest_nucleus():
    # sorted: 0.4 (id 3), 0.3 (id 0), 0.2 (id 2), 0.1 (id 1): 0.4 < 0.65 <= 0.7, so the nucleus is {3, 0}
    probs = [0.3, 0.1, 0.2, 0.4]
    out = sample(repeated(probs, 2000), top_p=0.65, seed=np.arange(2000))
    assert set(np.flatnonzero(token_counts(out.token_ids, 4))) == {0, 3}


def test_top_p_always_keeps_the_top_token():
    out = sample(repeated([0.3, 0.1, 0.2, 0.4], 200), top_p=0.01, seed=np.arange(200))
    assert (out.token_ids == 3).all()


def test_min_p_drops_tokens_below_the_fraction_of_the_max_probability():
    # threshold 0.25 * 0.5 = 0.125: ids 1 (0.05) and 3 (0.1) go, ids 0, 2, 4 stay
    probs = [0.5, 0.05, 0.2, 0.1, 0.15]
    out = sample(repeated(probs, 2000), min_p=0.25, seed=np.arange(2000))
    assert set(np.flatnonzero(token_counts(out.token_ids, 5))) == {0, 2, 4}


@pytest.mark.parametrize("temperature", [0.7, 1.0, 2.0])
def test_empirical_distribution_matches_tempered_softmax(temperature):
    vocab_size, num_draws = 8, 20000
    logits = torch.randn(vocab_size, generator=torch.Generator().manual_seed(3)) * 1.5
    out = sample(logits.expand(num_draws, -1).contiguous(), temperature=temperature,
                 seed=np.arange(num_draws) * 7919 + 11)
    expected = torch.softmax(logits / temperature, dim=-1).double().numpy() * num_draws
    chi_square = (((token_counts(out.token_ids, vocab_size) - expected) ** 2) / expected).sum()
    assert chi_square < 30.0  # 7 degrees of freedom: p ~ 1e-4 for a correct sampler


def test_top_p_renormalized_nucleus_keeps_its_relative_probabilities():
    probs = [0.3, 0.1, 0.2, 0.4]
    out = sample(repeated(probs, 20000), top_p=0.65, seed=np.arange(20000))
    counts = token_counts(out.token_ids, 4)
    assert abs(counts[3] / (counts[0] + counts[3]) - 0.4 / 0.7) < 0.02


def test_seeded_sampling_is_batch_invariant():
    gen = torch.Generator().manual_seed(4)
    num_reqs, vocab_size = 12, 300
    logits = torch.randn(num_reqs, vocab_size, generator=gen) * 0.5
    settings = dict(
        temperature=np.linspace(0.0, 1.5, num_reqs), top_k=[0, 0, 50, 0, 5, 0, 0, 100, 0, 0, 0, 20],
        top_p=[1.0, 0.9, 1.0, 0.8, 1.0, 1.0, 0.95, 1.0, 1.0, 0.7, 1.0, 1.0], min_p=[0.0] * 6 + [0.05] * 6,
        seed=np.arange(num_reqs) * 1_000_003 - 5, output_pos=np.arange(num_reqs) % 4,
        repetition_penalty=[1.0, 1.3] * 6, num_logprobs=[-1, 2] * 6,
    )
    history = [([i, i + 1], [i + 2]) for i in range(num_reqs)]
    together = sample(logits, history, **settings).token_ids

    for perm in (torch.arange(num_reqs).flip(0), torch.randperm(num_reqs, generator=gen)):
        permuted = {name: np.asarray(value)[perm.numpy()] for name, value in settings.items()}
        shuffled = sample(logits[perm], [history[i] for i in perm], **permuted).token_ids
        assert torch.equal(shuffled, together[perm])
    for i in range(num_reqs):
        alone = {name: np.asarray(value)[i : i + 1] for name, value in settings.items()}
        assert sample(logits[i : i + 1], [history[i]], **alone).token_ids[0] == together[i]


def test_same_seed_draws_the_same_token_and_other_positions_draw_others():
    logits = torch.zeros(100, 1000)  # uniform: the draw is the noise's argmin of E
    by_pos = sample(logits, seed=42, output_pos=np.arange(100)).token_ids
    again = sample(logits, seed=42, output_pos=np.arange(100)).token_ids
    by_seed = sample(logits, seed=np.arange(100), output_pos=0).token_ids
    assert torch.equal(by_pos, again)
    assert len(set(by_pos.tolist())) >= 90
    assert len(set(by_seed.tolist())) >= 90


def test_noise_hash_matches_32bit_reference_arithmetic():
    def fmix32_reference(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x85EBCA6B) & 0xFFFFFFFF
        x ^= x >> 13
        x = (x * 0xC2B2AE35) & 0xFFFFFFFF
        return x ^ (x >> 16)

    values = [0, 1, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF]
    values += np.random.default_rng(5).integers(0, 2**32, 200).tolist()
    x = torch.tensor(values, dtype=torch.int64)
    assert _mul32(x, 0xC2B2AE35).tolist() == [(v * 0xC2B2AE35) & 0xFFFFFFFF for v in values]
    assert _fmix32(x).tolist() == [fmix32_reference(v) for v in values]


@pytest.mark.parametrize("shape", ["whole rows", "candidates", "one row"])
def test_the_cpu_noise_has_the_bits_of_the_int64_definition(shape):
    """The CPU computes the noise in uint32 numpy arithmetic; every value equals the int64 torch ops'
    (which the GPU runs) bit for bit, for whole rows (one row of ids for every draw) and gathered ids."""
    seed = np.array([0, -1, 2**63 - 1, -(2**63), 1 << 32, 12345], dtype=np.int64)
    keys = torch.from_numpy(noise_keys(seed, np.array([0, 2**31 - 1, 5, 0, 7, 3])))
    vocab = 151936
    if shape == "whole rows":
        ids = torch.arange(vocab).expand(len(seed), -1)
    elif shape == "candidates":
        ids = torch.randint(0, vocab, (len(seed), 64), generator=torch.Generator().manual_seed(2))
    else:
        keys, ids = keys[:, :1], torch.arange(vocab)[None, :]
    assert torch.equal(noise_at(keys, ids), _noise_at_int64(keys, ids))


def test_noise_is_finite_and_positive_for_extreme_seeds():
    seed = torch.tensor([0, -1, 2**63 - 1, -(2**63), 1 << 32], dtype=torch.int64)
    noise = exponential_noise(seed, torch.tensor([0, 2**31 - 1, 5, 0, 0]), 4096)
    assert noise.shape == (5, 4096) and torch.isfinite(noise).all() and (noise > 0).all()
    assert abs(noise.mean().item() - 1.0) < 0.03  # Exp(1)
    assert len({tuple(row[:8].tolist()) for row in noise}) == 5  # the seeds' high halves matter


def test_repetition_penalty_divides_positive_and_multiplies_negative_history_logits_only():
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 3.0, 0.5], [2.0, -2.0, 1.0, -1.0, 3.0, 0.5]])
    history = [([0, 1], [1, 2]), ([0, 1, 2], [])]
    plan = make_plan(2, history, repetition_penalty=[2.0, 1.0])
    penalized = apply_penalties(logits, SamplingTensors.from_plan(plan, plan.sampled_rows, "cpu"))
    assert torch.equal(penalized[0], torch.tensor([1.0, -4.0, 0.5, -1.0, 3.0, 0.5]))
    assert torch.equal(penalized[1], logits[1])  # no penalty: its history is ignored


def test_presence_and_frequency_penalties_count_output_tokens_only():
    logits = torch.zeros(1, 6)
    history = [([4, 5, 5], [1, 2, 2, 2, 4])]
    plan = make_plan(1, history, presence_penalty=0.5, frequency_penalty=0.25)
    penalized = apply_penalties(logits, SamplingTensors.from_plan(plan, plan.sampled_rows, "cpu"))
    # id 1: once -> 0.5 + 0.25, id 2: three times -> 0.5 + 0.75, id 4: once in the output; 0, 3, 5 untouched
    assert torch.allclose(penalized[0], torch.tensor([0.0, -0.75, -1.25, 0.0, -0.75, 0.0]))


def test_repetition_penalty_steers_greedy_away_from_a_repeated_token():
    # row 0: 3 / 2 = 1.5 loses to 2.0 (and id 0 falls to 0.5); row 1 has no penalty
    logits = torch.tensor([[1.0, 3.0, 2.0]]).expand(2, -1).contiguous()
    out = sample(logits, [([0], [1]), ([], [1])], temperature=0.0, repetition_penalty=[2.0, 1.0])
    assert out.token_ids.tolist() == [2, 1]


def test_logprobs_are_of_the_raw_logits_and_top_n_sorted_with_the_argmax_first():
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(4, 64, generator=gen) * 3
    out = sample(logits, [([0, 1], [2])] * 4, temperature=0.5, top_k=10, repetition_penalty=1.5,
                 seed=np.arange(4), num_logprobs=[3, 0, -1, 5])
    raw = torch.log_softmax(logits, dim=-1)
    assert torch.allclose(out.sampled_logprobs, raw.gather(-1, out.token_ids.long()[:, None]).squeeze(-1))
    assert out.top_token_ids.shape == (4, 5) and out.top_token_ids.dtype == torch.int32
    assert (out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:]).all()
    assert torch.equal(out.top_token_ids[:, 0], logits.argmax(dim=-1).to(torch.int32))
    assert torch.allclose(out.top_logprobs, raw.gather(-1, out.top_token_ids.long()))
    assert torch.allclose(out.top_logprobs, raw.topk(5, dim=-1).values)


def test_rows_without_logprobs_still_sample_and_no_request_means_no_logprobs():
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(7))
    out = sample(logits, temperature=0.0, num_logprobs=-1)
    assert torch.equal(out.token_ids, logits.argmax(dim=-1).to(torch.int32))
    assert out.sampled_logprobs is None and out.top_token_ids is None and out.top_logprobs is None
    only_sampled = sample(logits, temperature=0.0, num_logprobs=[-1, 0, -1])
    assert only_sampled.sampled_logprobs.shape == (3,) and only_sampled.top_token_ids is None


def test_from_plan_takes_only_the_sampled_rows_and_their_history():
    history = [([1, 2], [3]), ([4], [5, 6]), ([7, 8, 9], [10])]
    plan = make_plan(3, history, logits_index=[0, -1, 2], seed=[10, 11, 12], temperature=[0.0, 1.0, 0.5],
                     repetition_penalty=[1.2, 1.2, 1.2], top_k=[-1, 3, 0], num_logprobs=[-1, 4, 2])
    st = SamplingTensors.from_plan(plan, plan.sampled_rows, "cpu")
    assert st.num_rows == 2 and st.seed.tolist() == [10, 12] and st.top_k.tolist() == [0, 0]
    assert st.history_rows.tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert st.history_ids.tolist() == [1, 2, 3, 7, 8, 9, 10]
    assert st.history_is_output.tolist() == [False, False, True, False, False, False, True]
    assert (st.all_greedy, st.any_penalties, st.max_top_k, st.max_num_logprobs) == (False, True, 0, 2)


def test_history_token_outside_the_vocabulary_is_rejected_by_name():
    plan = make_plan(1, [([3], [99])], repetition_penalty=1.5)
    with pytest.raises(ValueError, match="token id 99"):
        Sampler()(torch.zeros(1, 50), SamplingTensors.from_plan(plan, plan.sampled_rows, "cpu"))


def test_empty_batch_samples_nothing():
    plan = make_plan(0)
    out = Sampler()(torch.zeros(0, 10), SamplingTensors.from_plan(plan, plan.sampled_rows, "cpu"))
    assert out.token_ids.shape == (0,)


def test_logit_bias_moves_the_draw_and_leaves_the_logprobs_raw():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]]).expand(4, -1).contiguous()
    bias = [{0: 5.0}, {1: -100.0}, {}, {3: 100.0, 1: -1.0}]
    greedy = sample(logits, bias=bias, temperature=0.0, num_logprobs=0)
    assert greedy.token_ids.tolist() == [0, 2, 1, 3]
    raw = torch.log_softmax(logits, dim=-1)
    drawn = raw.gather(-1, greedy.token_ids.long()[:, None]).squeeze(-1)
    assert torch.allclose(greedy.sampled_logprobs, drawn)
    many = logits[:1].expand(64, -1).contiguous()
    seeded = sample(many, bias=[{3: 100.0}] * 64, temperature=1.0, seed=np.arange(64))
    assert seeded.token_ids.tolist() == [3] * 64  # e^100 outweighs every other token
    banned = sample(many, bias=[{1: -100.0, 2: -100.0}] * 64, temperature=1.0, seed=np.arange(64))
    assert set(banned.token_ids.tolist()) <= {0, 3}


def test_from_plan_takes_the_logit_bias_of_the_sampled_rows_only():
    plan = make_plan(3, logits_index=[0, -1, 2], bias=[{5: 1.0}, {6: 2.0}, {7: -3.0, 8: 4.0}])
    st = SamplingTensors.from_plan(plan, plan.sampled_rows, "cpu")
    assert st.bias_rows.tolist() == [0, 1, 1] and st.bias_ids.tolist() == [5, 7, 8]
    assert st.bias_values.tolist() == [1.0, -3.0, 4.0] and st.any_bias and st.max_bias_id == 8
    assert not SamplingTensors.from_plan(make_plan(2), np.arange(2), "cpu").any_bias
    with pytest.raises(ValueError, match="logit bias names token id 8"):
        Sampler()(torch.zeros(2, 8), st)
