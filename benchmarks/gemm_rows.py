"""cuBLAS's block-scaled FP8 GEMM (the served prefill product, `fp8_gemm.scaled_mm_gemm`) at
Qwen3-14B's four shapes, timed per row count: does padding a step's rows change the tile cuBLAS
picks for the better? Each (product, rows) pair is timed `--repeats` times in a shuffled order
(clocks drift under FP8's power draw, so a sweep in order mistakes the drift for the row count),
and the median is reported with the kernel cuBLAS ran.

    python -m benchmarks.gemm_rows --rows 1792,2048,4096,7168,7680,7936,8192,8448,8704,9216
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch

from benchmarks.lib.fp8_gemm_cases import QWEN3_14B_LINEARS

# (N, K) of each product of a Qwen3-14B layer, TP 1.
SHAPES = {layer: (n, k) for layer, n, k in QWEN3_14B_LINEARS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1792,2048,4096,8192", help="row counts (multiples of 16)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10, help="calls a timing")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.gemm_rows needs a CUDA GPU")
    from core.execution.model.fp8_format import quantize_weight
    from core.execution.model.fp8_gemm import scaled_mm_product
    from core.execution.model.fp8_kernels import quantize_activations

    rows_list = [int(r) for r in args.rows.split(",")]
    assert all(r % 16 == 0 for r in rows_list), "cuBLAS takes rows in multiples of 16"
    torch.manual_seed(0)
    random.seed(0)
    weights = {name: quantize_weight(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
               for name, (n, k) in SHAPES.items()}
    inputs = {(name, m): quantize_activations(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                                              column_major_scales=True, rows=m)
              for name, (_, k) in SHAPES.items() for m in rows_list}

    def call(name: str, m: int) -> torch.Tensor:
        (w, w_scales), (x, x_scales) = weights[name], inputs[name, m]
        return scaled_mm_product(x, x_scales, w, w_scales, torch.bfloat16)

    def time_us(name: str, m: int) -> float:
        for _ in range(2):
            call(name, m)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            call(name, m)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / args.iters * 1000

    kernels = {key: _kernel_name(lambda key=key: call(*key)) for key in inputs}
    times: dict[tuple[str, int], list[float]] = {key: [] for key in inputs}
    for _ in range(args.repeats):
        keys = list(inputs)
        random.shuffle(keys)
        for key in keys:
            times[key].append(time_us(*key))
    print(f"{torch.cuda.get_device_name()}: median of {args.repeats} interleaved timings")
    for name, (n, k) in SHAPES.items():
        for m in rows_list:
            us = statistics.median(times[name, m])
            print(f"{name:8s} {m:6d} rows: {us:8.1f} us (min {min(times[name, m]):8.1f}) "
                  f"{2 * m * n * k / us / 1e6:6.0f} TFLOP/s  {kernels[name, m]}")
    for m in rows_list:
        us = sum(statistics.median(times[name, m]) for name in SHAPES)
        print(f"a layer's products at {m:6d} rows: {us:8.1f} us, {us / m * 1000:6.1f} ns a row")


def _kernel_name(fn) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [event.name for event in prof.events() if event.device_type.name == "CUDA"]
    return names[-1][:60] if names else "?"


if __name__ == "__main__":
    main()
