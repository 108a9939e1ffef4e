"""How far FP8 logits move when nothing is wrong: the noise floor the FP8 model tests compare against.

A linear layer that quantizes its activations to e4m3 (1 x 128 groups) is discontinuous: an input
that moves by one float32 ulp can cross a rounding boundary, and that activation then moves by up to
1/16 of its group's scale. Through a few layers of random weights such steps add up: on qwen3-tiny in
float32 (benchmarks/NOTES.md), nudging every GEMM output by 1e-7 relative moves the logits by
1.2-2 % (max over the output / max of the output); by 5e-3, 4-5 %. The weight-only path, which
keeps the activations, moves by 5e-7. Two correct FP8 implementations that differ in the last bits
anywhere upstream (another summation order, an attention split) therefore differ by percents, and
an FP8 test can only ask that they differ no more than such a nudge makes them.

Used by tests/test_fp8_noise_floor.py (the premise, on the CPU) and tests/gpu/test_gpu_fp8.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from plans import Chunk, make_plan

from core.execution.model.fp8_format import reference_matmul
from core.execution.model.fp8_linear import Fp8LinearMethod
from core.execution.runner import ModelRunner

Gemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
BLOCK_SIZE = 16


def max_relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected.float()).abs().max() / expected.float().abs().max())


def mean_relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected.float()).abs().mean() / expected.float().abs().mean())


def exact_gemm(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """The FP8 layer's definition: activations quantized as the kernels do, a float32 GEMM."""
    return reference_matmul(x.float(), weight, scale_inv).to(x.dtype)


def weight_only_gemm(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    return reference_matmul(x.float(), weight, scale_inv, quantize_activations=False).to(x.dtype)


def nudged(gemm: Gemm, size: float, seed: int = 0) -> Gemm:
    """`gemm` with every output element scaled by (1 + size * a standard normal draw)."""
    generator = torch.Generator().manual_seed(seed)

    def run(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
        out = gemm(x, weight, scale_inv)
        noise = torch.randn(out.shape, generator=generator).to(out.device, out.dtype)
        return out * (1 + size * noise)

    return run


def use_gemm(runner: ModelRunner, gemm: Gemm) -> None:
    """Every FP8 linear layer of the runner's model multiplies with `gemm` from now on."""
    for module in runner.model.modules():
        method = getattr(module, "linear_method", None)
        if isinstance(method, Fp8LinearMethod):
            method.gemm = gemm


def decode_plans(batch: int, seed: int, steps: int = 4) -> list:
    """A prefill of `batch` random prompts (1-299 tokens), then `steps` decode steps of them all."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 300, batch)
    pages = [list(range(i * 30, i * 30 + 30)) for i in range(batch)]
    prompts = [rng.integers(0, 150_000, n).tolist() for n in lengths]
    plans = [make_plan([Chunk(p, 0, pg) for p, pg in zip(prompts, pages)], BLOCK_SIZE, step_id=0)]
    for step in range(1, steps + 1):
        plans.append(make_plan([Chunk([int(rng.integers(0, 150_000))], int(n) + step - 1, pg)
                                for n, pg in zip(lengths, pages)], BLOCK_SIZE, step_id=step))
    return plans


def step_logits(runner: ModelRunner, plans: list) -> list[torch.Tensor]:
    return [runner.forward_logits(plan)[0].float().clone() for plan in plans]
