"""The runner and sampler on CUDA agree with transformers and with the CPU."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch
from plans import Chunk, make_plan
from tiny_models import build_tiny_checkpoint

from core.config import CacheConfig, EngineConfig, ModelConfig
from core.execution.runner import ModelRunner
from core.execution.sampling_noise import exponential_noise

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize("rope", [None, YARN], ids=["rope", "yarn"])
@pytest.mark.parametrize("dtype,tolerance", [("float32", 1e-4), ("bfloat16", 3e-2)])
def test_cuda_logits_match_transformers(tmp_path, dtype, tolerance, rope):
    """With YaRN, a prompt of 150 tokens runs past the original context of 64."""
    hf = build_tiny_checkpoint(tmp_path, seed=4, rope_parameters=rope).to("cuda", getattr(torch, dtype))
    config = EngineConfig(
        model=ModelConfig.from_pretrained(tmp_path, dtype=dtype),
        cache=CacheConfig(block_size=16, num_pages=32),
        device="cuda",
    )
    runner = ModelRunner(config, show_progress=False)
    prompt = np.random.default_rng(0).integers(0, 256, size=45 if rope is None else 150).tolist()
    pages = [3, 8, 1] if rope is None else [3, 8, 1, 12, 30, 7, 20, 5, 9, 14]
    ours, _ = runner.forward_logits(make_plan([Chunk(prompt, 0, pages)], 16))
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt], device="cuda")).logits[0, -1].float()
    assert float((ours[0] - theirs).abs().max() / theirs.abs().max()) < tolerance


def test_sampling_noise_is_identical_on_cpu_and_cuda():
    seed = torch.tensor([0, 7, -(2**63), 2**63 - 1], dtype=torch.int64)
    pos = torch.tensor([0, 3, 5, 2**31 - 1], dtype=torch.int64)
    cpu = exponential_noise(seed, pos, 151936)
    gpu = exponential_noise(seed.cuda(), pos.cuda(), 151936).cpu()
    assert torch.equal(cpu, gpu)


def test_a_cuda_runner_logs_every_phase_of_its_start_in_order(caplog):
    from core.config import SchedulerConfig

    config = EngineConfig(model=ModelConfig.from_name("qwen3-tiny", dtype="bfloat16"),
                          scheduler=SchedulerConfig(max_model_len=512, max_num_seqs=8), device="cuda")
    with caplog.at_level(logging.INFO, logger="cadence.startup"):
        ModelRunner(config, show_progress=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "cadence.startup"]
    started = [line.removesuffix(" ...") for line in lines if line.endswith(" ...")]
    assert started == ["loading weights", "profiling memory", "compiling kernels",
                       "capturing decode CUDA graphs up to batch 8"], lines
    for name in started:
        assert any(re.fullmatch(rf"{re.escape(name)}: done in \d+\.\d s", line) for line in lines), lines
