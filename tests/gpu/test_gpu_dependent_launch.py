"""Programmatic dependent launch changes when the decode step's kernels start, never what they
compute: the 14B shape (two layers) in bf16 and in FP8, decode graphs and a prefill, gives the same
logits bit for bit with CADENCE_PDL on and off. A kernel that read its predecessor's output before
the predecessor finished (a missing gdc_wait) would show here as a difference."""

from __future__ import annotations

import pytest
import torch
from model_steps import fourteen_b_runner, step_logits

from core.execution import dependent_launch


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_logits_are_the_same_with_and_without_dependent_launch(quantization, monkeypatch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    results = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("CADENCE_PDL", setting)
        dependent_launch.reread_environment()
        assert dependent_launch.dependent_launch(torch.device("cuda")) == (setting == "1")
        runner = fourteen_b_runner(quantization)
        results[setting] = [step_logits(runner, batch, seed=batch) for batch in (1, 4)]
        del runner
        torch.cuda.empty_cache()
    dependent_launch.reread_environment()
    for batch, on, off in zip((1, 4), results["1"], results["0"]):
        for step, (a, b) in enumerate(zip(on, off)):
            assert torch.equal(a, b), f"batch {batch}, step {step}: logits differ with PDL on and off"
