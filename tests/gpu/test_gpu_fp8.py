"""FP8 linear layers on the GPU: the Triton kernels (and torch's scaled_mm, where this torch has block
scales) at Qwen3-14B's shapes against the torch definition, the 14B shape served with
`--quantization fp8` against the same model with exact float32 GEMMs, and decode CUDA graphs with
FP8 linears.

Tolerances, and why:
* Activation quantization: bit for bit. The kernel divides in IEEE float32 (div_rn) and rounds to
  nearest even, as the float32 reference does.
* GEMM, bf16 output: max |kernel - reference| <= 1e-2 * max |reference| and mean <= 5e-3 * mean.
  Both multiply the same fp8 values and scales. On the H200 the Triton GEMM and torch's cuBLAS
  block-scaled scaled_mm both came out 0.53-0.67 % (max) from the float32 reference, and on an H100
  both 0.28-0.34 % (mean), more than the bf16 rounding (about 0.1 % mean) explains: the FP8 tensor
  cores accumulate a 128-wide K step with less than float32's precision. The two are also held to
  that bound against each other. The decode GEMV (CUDA cores, float32) gets the same bound.
* The model against exact float32 GEMMs, and graphs against eager: FP8 activation quantization is
  discontinuous, so two correct implementations that differ in the last bits anywhere upstream
  differ by percents in the logits (tests/fp8_noise.py; its premise is checked on the CPU by
  tests/test_fp8_noise_floor.py). Each such test measures that noise floor on the same model and
  inputs, with the exact GEMMs' outputs nudged by a known amount, and asks for no more than it
  (a fault, such as a wrong scale or stale rows, moves logits by far more):
  - the Triton GEMMs against exact ones: no further than a 5e-3 nudge of the exact GEMMs moves them
    (about the GEMMs' own difference), times 1.5;
  - decode graphs against eager with the Triton GEMMs: no further than a 1e-7 nudge, times 3 (the
    graph's attention may differ from eager's in the last bits); with the dequantizing GEMM, which
    keeps the activations, graphs and eager agree within 1e-4 as the bf16 graphs do.

    pytest tests/gpu/test_gpu_fp8.py -v -s
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from fp8_noise import (
    decode_plans,
    exact_gemm,
    max_relative,
    mean_relative,
    nudged,
    step_logits,
    use_gemm,
)
from plans import Chunk, make_plan

from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.model.fp8_format import (
    FP8_DTYPE,
    quantize_activations_reference,
    quantize_weight,
    reference_matmul,
)
from core.execution.model.fp8_gemm import (
    ENV,
    FP8_GEMMS,
    row_gemv_gemm,
    scaled_mm_gemm,
    scaled_mm_unavailable,
    triton_gemm,
)
from core.execution.model.fp8_gemv import GEMV_MAX_M, GemvTiles, fp8_gemv
from core.execution.model.fp8_kernels import block_fp8_matmul, quantize_activations
from core.execution.model.fp8_row_gemv import ROW_GEMV_MAX_M, RowGemvTiles, fp8_row_gemv
from core.execution.runner import ModelRunner

# Qwen3-14B's linear layers at TP=1: (name, N, K).
SHAPES = [("qkv_proj", 7168, 5120), ("o_proj", 5120, 5120), ("gate_up_proj", 34816, 5120),
          ("down_proj", 5120, 17408)]
GEMM_MAX_ERROR, GEMM_MEAN_ERROR = 1e-2, 5e-3
BLOCK_SIZE = 16


def assert_gemm_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    worst, mean = max_relative(got, expected), mean_relative(got, expected)
    assert worst <= GEMM_MAX_ERROR and mean <= GEMM_MEAN_ERROR, f"max {worst:.3%}, mean {mean:.3%}"


def inputs(m: int, n: int, k: int, seed: int = 0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, generator=generator, device="cuda").to(torch.bfloat16)
    weight = 0.02 * torch.randn(n, k, generator=generator, device="cuda")
    return x, *quantize_weight(weight)


@pytest.mark.parametrize("m", [1, 7, 64, 300, 2048])
def test_activation_quantization_equals_the_reference_bit_for_bit(m):
    x, _, _ = inputs(m, 128, 17408, seed=m)
    q, scales = quantize_activations(x)
    expected_q, expected_scales = quantize_activations_reference(x)
    assert torch.equal(scales, expected_scales)
    assert torch.equal(q.float(), expected_q.float())


@pytest.mark.parametrize("m", [1, 16, 64, 256, 2048])
@pytest.mark.parametrize("name,n,k", SHAPES, ids=[s[0] for s in SHAPES])
def test_triton_gemm_at_qwen3_14b_shapes_equals_the_reference(name, n, k, m):
    x, weight, scale_inv = inputs(m, n, k, seed=n + m)
    q, scales = quantize_activations(x)
    out = block_fp8_matmul(q, scales, weight, scale_inv, torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert_gemm_close(out, reference_matmul(x.float(), weight, scale_inv))
    if m > GEMV_MAX_M:
        assert torch.equal(triton_gemm(x, weight, scale_inv), out)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("name,n,k", SHAPES, ids=[s[0] for s in SHAPES])
def test_decode_gemv_at_qwen3_14b_shapes_equals_the_reference(name, n, k, m):
    x, weight, scale_inv = inputs(m, n, k, seed=n + m)
    q, scales = quantize_activations(x)
    out = fp8_gemv(q, scales, weight, scale_inv, torch.bfloat16)
    if ROW_GEMV_MAX_M < m <= GEMV_MAX_M:
        assert torch.equal(triton_gemm(x, weight, scale_inv), out)  # the Triton decode path is the GEMV
    reference = reference_matmul(x.float(), weight, scale_inv)
    assert_gemm_close(out, reference)
    assert_gemm_close(out, block_fp8_matmul(q, scales, weight, scale_inv, torch.bfloat16))
    for tiles in (GemvTiles(16, 1, 4, 4), GemvTiles(32, 2, 6, 4), GemvTiles(8, 3, 2, 8)):
        assert_gemm_close(fp8_gemv(q, scales, weight, scale_inv, torch.bfloat16, tiles), reference)


@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("name,n,k", SHAPES, ids=[s[0] for s in SHAPES])
def test_row_gemv_at_qwen3_14b_shapes_equals_the_reference_and_a_row_alone_its_batch(name, n, k, m):
    x, weight, scale_inv = inputs(m, n, k, seed=n + m)
    q, scales = quantize_activations(x)
    out = fp8_row_gemv(q, scales, weight, scale_inv, torch.bfloat16)
    reference = reference_matmul(x.float(), weight, scale_inv)
    assert_gemm_close(out, reference)
    for tiles in (RowGemvTiles(1, 512, 4), RowGemvTiles(8, 1024, 8), RowGemvTiles(4, 2048, 8)):
        assert_gemm_close(fp8_row_gemv(q, scales, weight, scale_inv, torch.bfloat16, tiles), reference)
    alone = fp8_row_gemv(q[-1:], scales[-1:], weight, scale_inv, torch.bfloat16)
    assert torch.equal(alone, out[-1:]), "a row alone computes otherwise than in a step of several"


@pytest.mark.parametrize("m", [1, 3, 9, 16, 64, 256, 1784, 2048])
@pytest.mark.parametrize("name,n,k", SHAPES, ids=[s[0] for s in SHAPES])
def test_scaled_mm_with_block_scales_equals_the_reference_where_torch_has_it(name, n, k, m):
    skip_without_scaled_mm()
    x, weight, scale_inv = inputs(m, n, k, seed=n + m)
    out = scaled_mm_gemm(x, weight, scale_inv)  # every row count: padded to what cuBLAS takes
    assert out.shape == (m, n)
    assert_gemm_close(out, reference_matmul(x.float(), weight, scale_inv))
    assert_gemm_close(triton_gemm(x, weight, scale_inv), out)  # two implementations, one answer
    auto = row_gemv_gemm(x, weight, scale_inv)  # auto's: the row GEMV at one row, else scaled_mm
    if m <= ROW_GEMV_MAX_M:
        assert torch.equal(auto, fp8_row_gemv(*quantize_activations(x), weight, scale_inv, torch.bfloat16))
        assert torch.equal(triton_gemm(x, weight, scale_inv), auto)  # the Triton path's one row too
        assert_gemm_close(auto, out)
    else:
        assert torch.equal(auto, out)


def skip_without_scaled_mm() -> None:
    why = scaled_mm_unavailable(torch.device("cuda"))
    if why:
        pytest.skip(f"torch {torch.__version__} has no block-scaled scaled_mm here: {why}")


# --- the model ------------------------------------------------------------------------------------


def fp8_14b_runner(num_layers: int | None = None, **engine) -> ModelRunner:
    model = ModelConfig.from_name("qwen3-14b", dtype="bfloat16", load_format="dummy")
    if num_layers is not None:
        model = model.with_overrides(num_layers=num_layers)
    config = EngineConfig(model=model.quantized_at_load("fp8"), cache=CacheConfig(block_size=BLOCK_SIZE),
                          scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=64),
                          device="cuda", **engine)
    return ModelRunner(config, num_pages=512, show_progress=False)


def logits_of(runner: ModelRunner, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    pages = list(range(-(-(len(prompt) + len(continuation)) // BLOCK_SIZE)))
    rows = [runner.forward_logits(make_plan([Chunk(prompt, 0, pages)], BLOCK_SIZE))[0][0]]
    for i, token in enumerate(continuation):
        plan = make_plan([Chunk([token], len(prompt) + i, pages)], BLOCK_SIZE, step_id=i + 1)
        rows.append(runner.forward_logits(plan)[0][0])
    return torch.stack(rows).float()


def triton_against_exact(runner: ModelRunner, prompt: list[int], continuation: list[int]
                         ) -> tuple[float, float]:
    """(mean relative logit error of the Triton GEMMs against exact ones, the same for exact GEMMs
    nudged by 5e-3): the error and the noise floor it is judged against."""
    ours = logits_of(runner, prompt, continuation)
    use_gemm(runner, exact_gemm)
    exact = logits_of(runner, prompt, continuation)
    use_gemm(runner, nudged(exact_gemm, 5e-3))
    noise = logits_of(runner, prompt, continuation)
    error, floor = mean_relative(ours, exact), mean_relative(noise, exact)
    print(f"\nFP8 GEMMs ({os.environ.get(ENV, 'auto')}) vs exact: mean relative logit error {error:.3%}, max "
          f"{max_relative(ours, exact):.3%}; exact GEMMs nudged by 5e-3: {floor:.3%}")
    return error, floor


@pytest.mark.parametrize("gemm", ["triton", "scaled_mm", "row_gemv"])
def test_one_layer_of_the_14b_shape_in_fp8_tracks_exact_gemms(gemm, monkeypatch):
    if gemm != "triton":
        skip_without_scaled_mm()
    monkeypatch.setenv(ENV, gemm)
    runner = fp8_14b_runner(num_layers=1, enforce_eager=True)
    rng = np.random.default_rng(0)
    error, floor = triton_against_exact(runner, rng.integers(0, 151_000, 512).tolist(),
                                        rng.integers(0, 151_000, 8).tolist())
    assert error <= 1.5 * floor


def test_the_14b_shape_in_fp8_holds_fp8_weights_and_tracks_exact_gemms():
    runner = fp8_14b_runner(enforce_eager=True)
    linear_bytes = sum(p.numel() * p.element_size() for name, p in runner.model.named_parameters()
                       if name.endswith(("proj.weight", "proj.weight_scale_inv")))
    down = runner.model.model.layers[0].mlp.down_proj
    assert down.weight.dtype == FP8_DTYPE and down.weight_scale_inv.shape == (40, 136)
    assert linear_bytes < 13.5e9, f"the linear weights take {linear_bytes / 1e9:.1f} GB, not ~13.3 in FP8"
    rng = np.random.default_rng(1)
    error, floor = triton_against_exact(runner, rng.integers(0, 151_000, 512).tolist(),
                                        rng.integers(0, 151_000, 16).tolist())
    assert error <= 1.5 * floor


def tiny_fp8_runner(eager: bool) -> ModelRunner:
    model = ModelConfig.from_name("qwen3-tiny", dtype="float32").quantized_at_load("fp8")
    config = EngineConfig(model=model, cache=CacheConfig(block_size=BLOCK_SIZE, num_pages=2048),
                          scheduler=SchedulerConfig(max_model_len=1024, max_num_seqs=40), device="cuda",
                          enforce_eager=eager)
    return ModelRunner(config, show_progress=False)


@pytest.mark.parametrize("batch", [1, 5, 40])
def test_decode_graphs_with_the_dequantizing_gemm_replay_eagers_numbers(batch, monkeypatch):
    monkeypatch.setenv(ENV, "dequant")  # chosen when the layers are built, before the graphs are captured
    graphs, eager = tiny_fp8_runner(eager=False), tiny_fp8_runner(eager=True)
    assert graphs.graphs is not None
    plans = decode_plans(batch, seed=batch)
    for step, (ours, theirs) in enumerate(zip(step_logits(graphs, plans), step_logits(eager, plans))):
        assert max_relative(ours, theirs) < 1e-4, f"step {step}: graph and eager logits differ"


@pytest.mark.parametrize("gemm", ["triton", "scaled_mm", "row_gemv"])
@pytest.mark.parametrize("batch", [1, 5, 40])
def test_decode_graphs_with_fp8_gemms_stay_within_the_noise_floor(batch, gemm, monkeypatch):
    if gemm != "triton":
        skip_without_scaled_mm()
    monkeypatch.setenv(ENV, gemm)
    graphs, eager, nudge = (tiny_fp8_runner(eager=False), tiny_fp8_runner(eager=True),
                            tiny_fp8_runner(eager=True))
    assert graphs.graphs is not None
    use_gemm(nudge, nudged(FP8_GEMMS[gemm], 1e-7))
    plans = decode_plans(batch, seed=batch)
    reference = step_logits(eager, plans)
    floor = max(max_relative(n, r) for n, r in zip(step_logits(nudge, plans), reference))
    difference = max(max_relative(g, r) for g, r in zip(step_logits(graphs, plans), reference))
    print(f"\nbatch {batch}: {gemm} FP8 graph vs eager {difference:.3%}; eager nudged by 1e-7 {floor:.3%}")
    assert difference <= max(3 * floor, 1e-4)
