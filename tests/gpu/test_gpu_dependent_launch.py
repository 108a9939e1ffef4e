"""Programmatic dependent launch changes when the decode step's kernels start, never what they
compute: the 14B shape (two layers) in bf16 and in FP8, decode graphs and a prefill, gives the same
logits bit for bit with CADENCE_PDL on and off. A kernel that read its predecessor's output before
the predecessor finished (a missing gdc_wait) would show here as a difference."""

from __future__ import annotations

import pytest
import torch
from model_steps import assert_same_logits_on_and_off

from core.execution import dependent_launch


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_logits_are_the_same_with_and_without_dependent_launch(quantization, monkeypatch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    cuda = torch.device("cuda")
    assert_same_logits_on_and_off(monkeypatch, "CADENCE_PDL", lambda: dependent_launch.dependent_launch(cuda),
                                  dependent_launch.reread_environment, quantization)
