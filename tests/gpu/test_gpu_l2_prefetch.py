"""The L2 prefetch of o_proj's weight changes when bytes arrive, never what is computed: the 14B shape
(two layers) in FP8, a prefill and eight decode steps (CUDA graphs), gives the same logits bit for
bit with CADENCE_L2_PREFETCH on and off; and on the GPU the prefetch is issued."""

from __future__ import annotations

import pytest
import torch
from model_steps import assert_same_logits_on_and_off

from core.execution.model import l2_prefetch


def _sm90() -> None:
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the bulk L2 prefetch is an sm_90 instruction")


def test_a_prefetch_is_issued_for_an_fp8_weight_and_not_for_one_larger_than_its_share(monkeypatch):
    _sm90()
    monkeypatch.setenv("CADENCE_L2_PREFETCH", "1")
    l2_prefetch.reread_environment()
    fp8_o_proj = torch.randn(5120, 5120, device="cuda").to(torch.float8_e4m3fn)
    assert l2_prefetch.prefetch_l2(fp8_o_proj) is True
    assert l2_prefetch.prefetch_l2(fp8_o_proj[:, :5000].contiguous()) is True  # a ragged last piece
    torch.cuda.synchronize()  # an illegal address would surface here
    assert l2_prefetch.prefetch_l2(torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)) is False
    l2_prefetch.reread_environment()


def test_logits_are_the_same_with_and_without_the_prefetch(monkeypatch):
    _sm90()
    cuda = torch.device("cuda")
    assert_same_logits_on_and_off(monkeypatch, "CADENCE_L2_PREFETCH",
                                  lambda: l2_prefetch.l2_prefetch_enabled(cuda),
                                  l2_prefetch.reread_environment, "fp8")
