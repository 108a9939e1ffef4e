"""Statistical and structural properties of the sampler's random paths (CPU, torch paths).

Every test draws with fixed seeds, so it is deterministic: a correct sampler passes it every time,
and the thresholds (chi-square at p = 1e-4) leave a wrong one no room. The expected distributions
are computed here in float64 numpy from the rule in core/execution/sampling_paths.py, independently of it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from core.execution.sampler import SamplingTensors, candidate_count, sample_tokens
from tests.sampler_reference import reference_tokens
from tests.test_sampler import make_plan, sample

SETTINGS = ("temperature", "top_k", "top_p", "min_p", "seed", "output_pos")


def filtered_distribution(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0,
                          min_p: float = 0.0) -> np.ndarray:
    """The distribution a row's draw must follow, float64 [V]."""
    logits = logits.astype(np.float64)
    order = np.lexsort((np.arange(len(logits)), -logits))  # logit down, id up
    p = np.exp((logits[order] - logits[order[0]]) / temperature)
    keep = p >= min_p
    if top_k > 0:
        keep &= np.arange(len(p)) < top_k
    kept = np.where(keep, p, 0.0)
    if top_p < 1.0:
        keep &= np.cumsum(kept) - kept < top_p * kept.sum()
    out = np.zeros(len(logits))
    out[order] = np.where(keep, p, 0.0)
    return out / out.sum()


def chi_square_limit(degrees: int, z: float = 3.719) -> float:
    """The chi-square quantile at upper tail z (3.719: p = 1e-4), by Wilson and Hilferty."""
    a = 2.0 / (9.0 * degrees)
    return degrees * (1.0 - a + z * math.sqrt(a)) ** 3


def assert_draws_follow(tokens: torch.Tensor, expected: np.ndarray) -> None:
    counts = np.bincount(tokens.numpy(), minlength=len(expected)).astype(np.float64)
    support = expected > 0
    outside = np.flatnonzero(counts * ~support)
    assert not len(outside), f"drew tokens outside the kept set: {outside}"
    expected_counts = expected[support] * counts.sum()
    # pool the kept tokens expected fewer than 5 times into one cell, as chi-square asks
    small = expected_counts < 5
    observed = np.append(counts[support][~small], counts[support][small].sum())
    wanted = np.append(expected_counts[~small], expected_counts[small].sum())
    observed, wanted = observed[wanted > 0], wanted[wanted > 0]
    if len(wanted) < 2:
        return
    statistic = float(((observed - wanted) ** 2 / wanted).sum())
    assert statistic < chi_square_limit(len(wanted) - 1), (statistic, len(wanted) - 1)


CASES = {  # name: (temperature, top_k, top_p, min_p)
    "tempered only": (0.8, 0, 1.0, 0.0),
    "top_k": (1.0, 7, 1.0, 0.0),
    "top_p": (0.9, 0, 0.8, 0.0),
    "min_p": (1.2, 0, 1.0, 0.1),
    "top_k + top_p": (0.6, 20, 0.95, 0.0),  # Qwen3's generation_config
    "top_k + min_p": (1.0, 12, 1.0, 0.05),
    "top_p + min_p": (1.0, 0, 0.7, 0.02),
    "top_k + top_p + min_p": (0.7, 15, 0.9, 0.03),
    "top_k above the candidates' need": (1.0, 40, 0.6, 0.0),
}


@pytest.mark.parametrize("case", CASES)
def test_draws_follow_the_filtered_distribution(case):
    temperature, top_k, top_p, min_p = CASES[case]
    vocab_size, num_draws = 48, 24_000
    logits = torch.randn(vocab_size, generator=torch.Generator().manual_seed(11)) * 1.5
    out = sample(logits.expand(num_draws, -1).contiguous(), temperature=temperature, top_k=top_k, top_p=top_p,
                 min_p=min_p, seed=np.arange(num_draws) * 7919 + 3, output_pos=np.arange(num_draws) % 17)
    expected = filtered_distribution(logits.numpy(), temperature, top_k, top_p, min_p)
    assert_draws_follow(out.token_ids.long(), expected)


def test_draws_over_a_large_vocabulary_follow_the_nucleus():
    # many tokens in the nucleus, a long tail outside it: the full-row path rejects often
    vocab_size, num_draws = 4096, 6000
    logits = torch.randn(vocab_size, generator=torch.Generator().manual_seed(12)) * 0.7
    logits[:10] += 4.0
    out = sample(logits.expand(num_draws, -1).contiguous(), temperature=1.0, top_p=0.5,
                 seed=np.arange(num_draws) + 99)
    expected = filtered_distribution(logits.numpy(), 1.0, top_p=0.5)
    assert 10 < np.count_nonzero(expected) < vocab_size // 2
    assert_draws_follow(out.token_ids.long(), expected)


def mixed_batch(num_rows: int, vocab_size: int, seed: int, ties: bool = False):
    """Random logits and a mix of every kind of row: greedy, top-k, full-row, each filter."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, vocab_size, generator=gen) * 3
    if ties:  # bfloat16 logits, as a bf16 model gives them: many exact ties
        logits = logits.to(torch.bfloat16).float()
    rng = np.random.default_rng(seed)
    settings = dict(
        temperature=rng.choice([0.0, 0.6, 1.0, 1.3], num_rows).astype(np.float32),
        top_k=rng.choice([0, 0, 1, 5, 20, 50, 200], num_rows),
        top_p=rng.choice([1.0, 0.95, 0.8, 0.5], num_rows).astype(np.float32),
        min_p=rng.choice([0.0, 0.0, 0.05, 0.2], num_rows).astype(np.float32),
        seed=rng.integers(-2**40, 2**40, num_rows), output_pos=rng.integers(0, 1000, num_rows),
    )
    return logits, settings


@pytest.mark.parametrize("ties", [False, True])
def test_the_fast_paths_draw_the_tokens_of_the_full_sort(ties):
    logits, settings = mixed_batch(400, 3000, seed=21, ties=ties)
    out = sample(logits, **settings).token_ids.long()
    expected = reference_tokens(logits, *(torch.as_tensor(settings[name]) for name in SETTINGS))
    assert torch.equal(out, expected)


def test_top_k_keeps_the_lowest_ids_among_logits_tied_at_the_kth():
    logits = torch.zeros(3000, 10)
    logits[:, 0] = 2.0  # one clear top, then nine tokens tied
    out = sample(logits, top_k=4, seed=np.arange(3000)).token_ids
    assert set(out.tolist()) == {0, 1, 2, 3}


@pytest.mark.parametrize("ties", [False, True])
def test_seeded_draws_do_not_depend_on_the_batch_around_them(ties):
    logits, settings = mixed_batch(64, 2000, seed=31, ties=ties)
    together = sample(logits, **settings).token_ids
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(1))
    permuted = sample(logits[perm], **{k: np.asarray(v)[perm.numpy()] for k, v in settings.items()}).token_ids
    assert torch.equal(permuted, together[perm])
    for i in range(0, 64, 3):  # alone, and beside rows whose top_k asks for more candidates
        alone = sample(logits[i : i + 1], **{k: np.asarray(v)[i : i + 1] for k, v in settings.items()})
        assert alone.token_ids[0] == together[i]
        wide = {k: np.asarray(v)[[i, i]] for k, v in settings.items()}
        wide["top_k"] = np.array([wide["top_k"][0], 1000])
        assert sample(logits[[i, i]], **wide).token_ids[0] == together[i]


def test_candidate_count_leaves_room_above_the_largest_top_k():
    counts = [candidate_count(k, 151_936) for k in (1, 15, 16, 20, 63, 64, 100)]
    assert counts == [16, 16, 32, 32, 64, 128, 128]
    assert candidate_count(5000, 1000) == 1000


def test_each_path_runs_only_for_its_rows():
    # one row of each kind; sample_tokens on the torch paths fills exactly the same tokens
    logits, _ = mixed_batch(3, 500, seed=41)
    plan = make_plan(3, temperature=[0.0, 0.8, 0.8], top_k=[0, 10, 0], top_p=[1.0, 0.9, 0.9], seed=[1, 2, 3])
    st = SamplingTensors.from_plan(plan, plan.sampled_rows, "cpu")
    assert st.top_k_rows.tolist() == [1] and st.full_rows.tolist() == [2] and st.max_top_k == 10
    tokens = sample_tokens(logits, st, use_triton=False)
    assert tokens[0] == logits[0].argmax()
    expected = reference_tokens(logits, torch.tensor([0.0, 0.8, 0.8]), torch.tensor([0, 10, 0]),
                                torch.tensor([1.0, 0.9, 0.9]), torch.zeros(3), torch.tensor([1, 2, 3]),
                                torch.zeros(3, dtype=torch.int64))
    assert torch.equal(tokens, expected)
