"""The sampler's Triton kernels (core/execution/sampling_kernels.py) draw the tokens of its torch paths.

The kernels run on the CPU through the Triton interpreter, as in tests/test_fused_ops.py: run alone,
this file sets TRITON_INTERPRET=1 itself; in a full test run (where an earlier module has imported
triton) `test_kernels_in_a_fresh_interpreter` runs it again in a child process. The torch paths are
the definition (tests/test_sampler_statistics.py checks them against the distributions); the
kernels sum in another order, so a draw could only differ where two scores agree to the last bits,
which these fixed seeds do not hit. tests/gpu/test_gpu_sampler.py repeats this on the GPU.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from triton_interpreter import is_interpreted, run_in_fresh_interpreter, skip_unless_interpreted  # noqa: E402

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]')")

from core.execution import sampling_kernels  # noqa: E402
from core.execution.sampler import SamplingTensors, sample_tokens  # noqa: E402
from core.execution.sampling_noise import noise_at, noise_keys  # noqa: E402
from tests.test_sampler import make_plan  # noqa: E402
from tests.test_sampler_statistics import mixed_batch  # noqa: E402

INTERPRETED = is_interpreted(triton.language.zeros, sampling_kernels._candidates_kernel)


@pytest.fixture(autouse=True)
def _kernels_run_here_or_in_the_child(request):
    skip_unless_interpreted(request, INTERPRETED)


def test_kernels_in_a_fresh_interpreter():
    run_in_fresh_interpreter(__file__, INTERPRETED)


def tensors(settings: dict, num_rows: int) -> SamplingTensors:
    plan = make_plan(num_rows, **settings)
    return SamplingTensors.from_plan(plan, plan.sampled_rows, "cpu")


@pytest.mark.parametrize("ties", [False, True])
def test_kernels_draw_the_tokens_of_the_torch_paths(ties):
    logits, settings = mixed_batch(48, 1500, seed=51, ties=ties)
    st = tensors(settings, 48)
    assert len(st.top_k_rows) and len(st.full_rows)
    kernels = sample_tokens(logits, st, use_triton=True)
    assert torch.equal(kernels, sample_tokens(logits, st, use_triton=False))


def test_kernel_noise_is_the_hash_of_sampling_noise():
    # equal logits and top_k = K: every candidate is kept with p = 1, so the draw is the noise's argmin
    num_rows, num_candidates = 16, 32
    ids = torch.stack([torch.randperm(5000, generator=torch.Generator().manual_seed(i))[:num_candidates]
                       for i in range(num_rows)])
    seed, output_pos = np.arange(num_rows) * 2**33 - 7, np.arange(num_rows) * 3
    keys = torch.from_numpy(noise_keys(seed, output_pos))
    out = torch.full((num_rows,), -1, dtype=torch.int64)
    ones = torch.ones(num_rows)
    sampling_kernels.sample_candidates(torch.zeros(num_rows, num_candidates), ids, ones,
                                       torch.full((num_rows,), num_candidates), ones, torch.zeros(num_rows),
                                       keys, out)
    expected = ids.gather(1, noise_at(keys, ids).argmin(dim=1, keepdim=True)).squeeze(1)
    assert torch.equal(out, expected)


def test_full_row_kernel_meets_a_small_nucleus_in_a_long_flat_tail():
    # nearly flat logits: the first race usually lands in the tail, so the kernel must reject and retry
    num_rows, vocab_size = 24, 6000
    logits = torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(61)) * 0.05
    logits[:, 100:104] += 8.0  # the four hold 2/3 of the mass: the first three 1/2, so top_p 0.6 keeps four
    settings = dict(temperature=1.0, top_p=0.6, seed=np.arange(num_rows))
    st = tensors(settings, num_rows)
    kernels = sample_tokens(logits, st, use_triton=True)
    assert set(kernels.tolist()) <= {100, 101, 102, 103}
    assert torch.equal(kernels, sample_tokens(logits, st, use_triton=False))


def test_rows_of_the_other_path_are_left_untouched():
    logits, _ = mixed_batch(4, 300, seed=71)
    st = tensors(dict(temperature=[0.0, 1.0, 1.0, 0.7], top_k=[0, 5, 0, 0], top_p=[1.0, 1.0, 0.9, 1.0],
                      seed=[1, 2, 3, 4]), 4)
    settings = (st.temperature, st.top_k, st.top_p, st.min_p, st.keys)
    out = torch.full((4,), -1, dtype=torch.int64)
    values, ids = logits.topk(16, dim=1)
    sampling_kernels.sample_candidates(values, ids, *settings, out)
    assert out[[0, 2, 3]].tolist() == [-1, -1, -1] and out[1] >= 0
    out[:] = -1
    sampling_kernels.sample_full_rows(logits, *settings, out)
    assert out[[0, 1]].tolist() == [-1, -1] and (out[[2, 3]] >= 0).all()
