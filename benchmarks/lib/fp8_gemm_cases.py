"""The FP8 rows of `python -m benchmarks.kernels --fp8`: every Qwen3-14B linear shape at decode and
prefill batch sizes, each way to multiply it (core/execution/model/fp8_gemm.py and the bf16 matmul it
replaces) timed against the H200's ceilings.

Per (layer, M) and path: the median time (triton.testing.do_bench, L2 flushed; and replayed from a
CUDA graph, as decode runs), the bytes it must move at least (the weight once, the activations in
and the output out; the FP8 paths also write and read the quantized activations and their scales),
TB/s against the bandwidth ceiling and TFLOP/s (2 M N K) against the tensor-core ceiling of its
dtype, and the error against `fp8_format.reference_matmul` in float32 (max |error| / max |ref|).
Paths: `bf16` (F.linear on the bf16 weight), `fp8 triton` (quantize + block-scaled GEMM, what the
server runs; up to 16 rows one launch that quantizes inside the GEMM), `fp8 triton gemm` (the GEMM
alone, activations already quantized), `fp8 scaled_mm block` (torch's scaled_mm with 1 x 128 /
128 x 128 scales, where this torch has it), `fp8 scaled_mm rowwise` (per-token x per-channel
scales: the layout the issue measured, not the checkpoint's format, for the speed it shows).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from triton.testing import do_bench, do_bench_cudagraph

from core.execution.model.fp8_format import quantize_weight, reference_matmul
from core.execution.model.fp8_gemm import scaled_mm_gemm, triton_gemm
from core.execution.model.fp8_kernels import MatmulTiles, block_fp8_matmul, matmul_tiles, quantize_activations

# (layer, N, K) at TP=1.
QWEN3_14B_LINEARS = [("qkv_proj", 7168, 5120), ("o_proj", 5120, 5120), ("gate_up_proj", 34816, 5120),
                     ("down_proj", 5120, 17408)]
BATCHES = (1, 8, 32, 64, 128, 256, 1024, 8192)
BF16_TFLOPS, FP8_TFLOPS = 989.0, 1979.0  # H200 dense tensor-core peaks


@dataclass
class GemmRow:
    layer: str
    m: int
    n: int
    k: int
    path: str
    mbytes: float
    do_bench_us: float | None
    graph_us: float | None
    error: float | None
    note: str = ""

    def tb_s(self, micros: float | None) -> float | None:
        return None if micros is None else self.mbytes * 1e6 / (micros * 1e-6) / 1e12

    def tflops(self, micros: float | None) -> float | None:
        return None if micros is None else 2 * self.m * self.n * self.k / (micros * 1e-6) / 1e12


def _timed(fn: Callable[[], torch.Tensor]) -> tuple[float | None, float | None, str]:
    try:
        micros = do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
    except Exception as exc:  # a path this torch or GPU refuses is a row that says why
        return None, None, f"{type(exc).__name__}: {str(exc)[:120]}"
    try:
        graph = do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
    except Exception as exc:
        return micros, None, f"graph: {type(exc).__name__}: {str(exc)[:80]}"
    return micros, graph, ""


def _error(fn: Callable[[], torch.Tensor], reference: torch.Tensor) -> float | None:
    try:
        return float((fn().float() - reference).abs().max() / reference.abs().max())
    except Exception:
        return None


def _rowwise_scaled_mm(x: torch.Tensor, weight: torch.Tensor) -> Callable[[], torch.Tensor]:
    """Per-token x per-channel scaled_mm on a weight requantized per output channel."""
    w_scale = weight.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-10) / 448.0  # [N, 1]
    w_q = (weight.float() / w_scale).to(torch.float8_e4m3fn)

    def run() -> torch.Tensor:
        x_scale = x.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-10) / 448.0  # [M, 1]
        x_q = (x.float() / x_scale).to(torch.float8_e4m3fn)
        return torch._scaled_mm(x_q, w_q.t(), scale_a=x_scale, scale_b=w_scale.t(), out_dtype=torch.bfloat16)

    return run


def gemm_rows(layer: str, m: int, n: int, k: int, device: str = "cuda") -> list[GemmRow]:
    generator = torch.Generator(device=device).manual_seed(m + n + k)
    x = torch.randn(m, k, generator=generator, device=device).to(torch.bfloat16)
    weight_bf16 = (0.02 * torch.randn(n, k, generator=generator, device=device)).to(torch.bfloat16)
    weight, scale_inv = quantize_weight(weight_bf16)
    reference = reference_matmul(x.float(), weight, scale_inv)
    x_q, x_scales = quantize_activations(x)
    activations = 2 * m * k + 2 * m * n  # bf16 in, bf16 out
    quantized = m * k + 4 * m * (k // 128)  # fp8 activations and their scales, written then read
    paths: list[tuple[str, float, Callable[[], torch.Tensor]]] = [
        ("bf16", 2 * n * k + activations, lambda: F.linear(x, weight_bf16)),
        ("fp8 triton", n * k + activations + 2 * quantized, lambda: triton_gemm(x, weight, scale_inv)),
        ("fp8 triton gemm", n * k + m * k + 2 * m * n,
         lambda: block_fp8_matmul(x_q, x_scales, weight, scale_inv, torch.bfloat16)),
        ("fp8 scaled_mm block", n * k + activations + 2 * quantized,
         lambda: scaled_mm_gemm(x, weight, scale_inv)),
        ("fp8 scaled_mm rowwise", n * k + activations + 2 * m * k, _rowwise_scaled_mm(x, weight_bf16)),
    ]
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    rows = []
    for path, nbytes, fn in paths:
        micros, graph, note = _timed(fn)
        if path == "fp8 triton":
            note = note or str(matmul_tiles(m, n, k, num_sms))
        rows.append(GemmRow(layer, m, n, k, path, nbytes / 1e6, micros, graph, _error(fn, reference), note))
    return rows


def all_gemm_rows(batches: tuple[int, ...] = BATCHES) -> list[GemmRow]:
    """Every layer at every batch size; each row is also printed as it is measured, so a run cut
    short by a timeout still leaves its figures."""
    rows = []
    for layer, n, k in QWEN3_14B_LINEARS:
        for m in batches:
            for row in gemm_rows(layer, m, n, k):
                us = row.graph_us or row.do_bench_us
                print(f"  {layer} M={m} {row.path}: {'-' if us is None else f'{us:.1f} us'} {row.note}",
                      flush=True)
                rows.append(row)
            torch.cuda.empty_cache()
    return rows


def print_gemm_table(rows: list[GemmRow], ceiling_tb_s: float) -> None:
    def fmt(value: float | None, spec: str) -> str:
        return "-".rjust(int(spec.split(".")[0])) if value is None else format(value, spec)

    header = (f"{'layer':13s} {'M':>5s} {'path':22s} {'MB':>8s} {'us':>9s} {'graph us':>9s} {'TB/s':>6s} "
              f"{'%BW':>5s} {'TFLOP/s':>8s} {'%TC':>5s} {'err':>8s}  note")
    print(header)
    print("-" * len(header))
    for r in rows:
        micros = r.graph_us if r.graph_us is not None else r.do_bench_us
        bw, tflops = r.tb_s(micros), r.tflops(micros)
        peak = BF16_TFLOPS if r.path == "bf16" else FP8_TFLOPS
        print(f"{r.layer:13s} {r.m:5d} {r.path:22s} {r.mbytes:8.1f} {fmt(r.do_bench_us, '9.1f')} "
              f"{fmt(r.graph_us, '9.1f')} {fmt(bw, '6.2f')} {fmt(bw and 100 * bw / ceiling_tb_s, '5.1f')} "
              f"{fmt(tflops, '8.1f')} {fmt(tflops and 100 * tflops / peak, '5.1f')} "
              f"{fmt(r.error, '8.1e')}  {r.note}")


def sweep_gemm_tiles(batches: tuple[int, ...] = (1, 32, 256, 8192)) -> list[dict]:
    """The Triton GEMM alone over a grid of tiles and split counts, per shape: for tuning
    `fp8_kernels.matmul_tiles`."""
    results = []
    for layer, n, k in QWEN3_14B_LINEARS:
        for m in batches:
            generator = torch.Generator(device="cuda").manual_seed(m)
            x = torch.randn(m, k, generator=generator, device="cuda").to(torch.bfloat16)
            weight, scale_inv = quantize_weight(0.02 * torch.randn(n, k, generator=generator, device="cuda"))
            x_q, x_scales = quantize_activations(x)
            block_ms = (16, 32, 64) if m <= 64 else (64, 128)
            for block_m in block_ms:
                for block_n in (32, 64, 128):
                    for split_k in ((1, 2, 4, 8, 16) if m <= 256 else (1,)):
                        for num_warps, num_stages in ((4, 3), (4, 4), (8, 3)):
                            tiles = MatmulTiles(block_m, block_n, split_k, num_warps, num_stages)
                            micros, graph, _ = _timed(functools.partial(
                                block_fp8_matmul, x_q, x_scales, weight, scale_inv, torch.bfloat16, tiles))
                            if micros is None:
                                continue
                            best = graph or micros
                            results.append({"layer": layer, "m": m, **tiles._asdict(), "us": best,
                                            "tb_s": (n * k + m * k + 2 * m * n) / (best * 1e-6) / 1e12,
                                            "tflops": 2 * m * n * k / (best * 1e-6) / 1e12})
    return results
