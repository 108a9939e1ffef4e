"""Every FP8 GEMM candidate at every Qwen3-14B linear shape, timed as a model step runs it: which path
and tiles `fp8_gemm` / `fp8_gemv` / `fp8_kernels.matmul_tiles` should pick per row count.

    python -m benchmarks.fp8_tiles --out fp8_tiles.json [--batches 1,2,4,8,16,256,1784,8192]

Per (layer, M): bf16 F.linear; up to 16 rows the activation quantization alone, the FP8 decode GEMV
(the quantization included, as served) with the tiles `gemv_tiles` picks and a grid of others
(columns a program, K splits, pipeline stages), up to 8 rows the row GEMV (fp8_row_gemv.py) with
its default tiles (and at one row a grid of others: rows a program, columns a piece, warps; from
two rows, 2-8 tokens a program, each weight row read once for them all), and the
tensor-core GEMM quantizing inside; from 256 rows the tensor-core GEMM's tile variants after a
separate quantization; the server's `triton` path (from 9 rows) and torch's block-scaled
`scaled_mm` (every M, its rows padded to 16 as `fp8_gemm.scaled_mm_gemm` does), and up to 64 rows
the same on the transposed product (the weight as cuBLAS's `a`: an experiment for decode,
`transposed_scaled_mm`). `--only REGEX` times only the candidates it names (besides bf16 and
scaled_mm).
Each is captured in a CUDA graph of >= 24 calls that rotate over enough copies of the weight (>= 200
MB) that every call reads its weight from HBM, not L2, as in a model step; the median of 5 replays
is the time per call. A path that fails prints why. Each line shows the four fastest FP8 candidates
with TB/s (weight bytes / time), TFLOP/s and the error against `fp8_format.reference_matmul` (max
|error| / max |reference|); the JSON has every figure.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.lib.fp8_gemm_cases import QWEN3_14B_LINEARS
from core.execution.model.fp8_format import quantize_weight, reference_matmul
from core.execution.model.fp8_gemm import scaled_mm_gemm, triton_gemm
from core.execution.model.fp8_gemv import GemvTiles, fp8_gemv
from core.execution.model.fp8_kernels import MatmulTiles, block_fp8_matmul, quantize_activations
from core.execution.model.fp8_row_gemv import RowGemvTiles, fp8_row_gemv

BATCHES = (1, 2, 4, 8, 16, 32, 64, 256, 1784, 8192)
ROTATED_BYTES = 200e6
ROW_GEMV_MEASURED_M = 8  # it serves one row; 2-8 show what a second token costs it
Call = Callable[[int], torch.Tensor]  # copy index -> output


def graph_us(call: Call, copies: int) -> tuple[float | None, str]:
    """Median microseconds per call, replayed from a CUDA graph that rotates over the copies."""
    try:
        for i in range(copies):
            call(i)  # compile and warm up
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            call(0)
        torch.cuda.synchronize()
        reps = copies * math.ceil(24 / copies)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for r in range(reps):
                call(r % copies)
        graph.replay()
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / reps)
        return sorted(times)[2], ""
    except Exception as exc:  # a candidate this torch or GPU refuses is a figure that says why
        torch.cuda.synchronize()
        return None, f"{type(exc).__name__}: {str(exc)[:120]}"


def transposed_scaled_mm(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                         column_major_x_scales: bool) -> torch.Tensor:
    """An experiment for decode, not served: cuBLAS's block-scaled GEMM on the transposed product,
    out^T [N, M] = weight [N, K] (128 x 128 scales, as `a`) @ x_q^T [K, M] (1 x 128 scales, as `b`),
    which torch dispatches as "block_128x128_1x128". At 16 rows cuBLAS runs the product with 128
    of the weight's N per tile, so the 5,120-column layers fill only 40 of 132 SMs and read their
    weight at 1.3 TB/s; with the weight as `a` the tile shape along N is cuBLAS's to choose anew.
    torch 2.11 wants `a`'s scales as [K/128, N/128] with strides (1, K/128) (the checkpoint's
    [N/128, K/128] transposed) and `b`'s as [M, K/128]; their strides are tried both ways."""
    from torch.nn.functional import ScalingType, SwizzleType

    m = x.shape[0]
    rows = -(-m // 16) * 16
    x_q, x_scales = quantize_activations(x, column_major_scales=column_major_x_scales, rows=rows)
    out_t = F.scaled_mm(weight, x_q.t(), weight_scale_inv.t(), ScalingType.BlockWise128x128, x_scales,
                        ScalingType.BlockWise1x128, swizzle_a=SwizzleType.NO_SWIZZLE,
                        swizzle_b=SwizzleType.NO_SWIZZLE, output_dtype=x.dtype)
    return out_t[:, :m].t().contiguous()


def candidates(m: int, x: torch.Tensor, bf16: list[torch.Tensor],
               fp8: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Call]:
    calls: dict[str, Call] = {"bf16": lambda i: F.linear(x, bf16[i])}
    if m <= 16:
        calls["dot fused"] = lambda i: block_fp8_matmul(x, None, *fp8[i], torch.bfloat16)
        calls["gemv"] = lambda i: fp8_gemv(*quantize_activations(x), *fp8[i], torch.bfloat16)
        calls["quantize only"] = lambda i: quantize_activations(x)[0]
        block_m = 1 << (m - 1).bit_length()
        for block_n, split_k, stages in itertools.product((8, 16, 32), (1, 2), (3, 6)):
            if block_m * block_n * 128 <= 16384:  # the [rows, columns, 128] accumulator, in registers
                tiles = GemvTiles(block_n, split_k, stages, 4)
                calls[f"gemv n{block_n} s{split_k} st{stages}"] = (
                    lambda i, tiles=tiles: fp8_gemv(*quantize_activations(x), *fp8[i], torch.bfloat16, tiles))
    if m <= ROW_GEMV_MEASURED_M:
        calls["row gemv"] = lambda i: fp8_row_gemv(*quantize_activations(x), *fp8[i], torch.bfloat16)
        for rows, chunk, warps in itertools.product((1, 2, 4, 8), (512, 1024, 2048), (4, 8)):
            if m == 1:
                for fold in (False, True):  # x's columns scaled first: fewer instructions a weight byte
                    tiles = RowGemvTiles(rows, chunk, warps, fold_scales=fold)
                    calls[f"row gemv{' fold' if fold else ''} r{rows} c{chunk} w{warps}"] = (
                        lambda i, tiles=tiles: fp8_row_gemv(*quantize_activations(x), *fp8[i], torch.bfloat16,
                                                            tiles))
        # Several tokens a program, each weight row read once for them all.
        for tokens, rows, chunk, warps in itertools.product((2, 4, 8), (2, 4), (1024, 2048), (4, 8)):
            if m > 1 and tokens <= 1 << (m - 1).bit_length():
                tiles = RowGemvTiles(rows, chunk, warps, tokens)
                calls[f"row gemv t{tokens} r{rows} c{chunk} w{warps}"] = lambda i, tiles=tiles: fp8_row_gemv(
                    *quantize_activations(x), *fp8[i], torch.bfloat16, tiles)
    if m > 8:
        calls["triton"] = lambda i: triton_gemm(x, *fp8[i])
    calls["scaled_mm"] = lambda i: scaled_mm_gemm(x, *fp8[i])  # rows padded to 16
    if m <= 64:
        calls["scaled_mm transposed"] = lambda i: transposed_scaled_mm(x, *fp8[i], False)
        calls["scaled_mm transposed, b scales column-major"] = (
            lambda i: transposed_scaled_mm(x, *fp8[i], True))
    if m >= 256:
        x_q, x_scales = quantize_activations(x)
        for tiles in (MatmulTiles(128, 128, 1, 8, 3), MatmulTiles(128, 128, 1, 8, 4),
                      MatmulTiles(64, 128, 1, 4, 4)):
            calls[f"dot m{tiles.block_m} n{tiles.block_n} w{tiles.num_warps} s{tiles.num_stages}"] = (
                lambda i, tiles=tiles: block_fp8_matmul(x_q, x_scales, *fp8[i], torch.bfloat16, tiles))
    return calls


def layer_rows(layer: str, n: int, k: int, batches: tuple[int, ...], only: re.Pattern | None = None
               ) -> list[dict]:
    generator = torch.Generator(device="cuda").manual_seed(n + k)
    copies = max(2, math.ceil(ROTATED_BYTES / (n * k)))
    bf16 = [(0.02 * torch.randn(n, k, generator=generator, device="cuda")).to(torch.bfloat16)
            for _ in range(copies)]
    fp8 = [quantize_weight(w) for w in bf16]
    rows = []
    for m in batches:
        x = torch.randn(m, k, generator=generator, device="cuda").to(torch.bfloat16)
        reference = reference_matmul(x.float(), *fp8[0])
        row = {"layer": layer, "m": m, "n": n, "k": k, "us": {}, "error": {}, "failed": {}}
        for name, call in candidates(m, x, bf16, fp8).items():
            if only is not None and name not in ("bf16", "scaled_mm") and not only.search(name):
                continue
            micros, failure = graph_us(call, copies)
            row["us"][name] = micros
            if failure:
                row["failed"][name] = failure
            elif name not in ("bf16", "quantize only"):
                row["error"][name] = float((call(0).float() - reference).abs().max() / reference.abs().max())
        print(summary(row), flush=True)
        rows.append(row)
    return rows


def summary(row: dict) -> str:
    m, n, k = row["m"], row["n"], row["k"]
    timed = sorted((us, name) for name, us in row["us"].items()
                   if us is not None and name not in ("bf16", "quantize only"))
    bf16 = row["us"]["bf16"]
    line = f"{row['layer']:12s} M={m:5d}  bf16 {bf16 if bf16 is None else round(bf16, 1)} us"
    for micros, name in timed[:4]:
        line += (f" | {name} {micros:.1f} us {n * k / micros / 1e6:.2f} TB/s "
                 f"{2 * m * n * k / micros / 1e6:.0f} TFLOP/s err {row['error'][name]:.1e}")
    paths = ("quantize only", "gemv", "row gemv", "dot fused", "triton", "scaled_mm")
    served = {name: row["us"].get(name) for name in paths if name in row["us"]}
    line += f" || {', '.join(f'{name} {us if us is None else round(us, 1)}' for name, us in served.items())}"
    return line + (f"  failed: {row['failed']}" if row["failed"] else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write every figure here as JSON")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)),
                        help="row counts M, comma-separated")
    parser.add_argument("--layers", default=",".join(name for name, _, _ in QWEN3_14B_LINEARS),
                        help="which of qkv_proj, o_proj, gate_up_proj, down_proj")
    parser.add_argument("--only", help="time only the candidates whose name this regex finds (and bf16, "
                        "scaled_mm), e.g. 'row gemv|^gemv$|quantize only'")
    args = parser.parse_args()
    only = re.compile(args.only) if args.only else None
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.fp8_tiles needs a CUDA GPU with FP8 (Hopper or newer)")
    batches = tuple(int(m) for m in args.batches.split(","))
    layers = args.layers.split(",")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = []
    for layer, n, k in QWEN3_14B_LINEARS:
        if layer in layers:
            rows += layer_rows(layer, n, k, batches, only)
            torch.cuda.empty_cache()
            if args.out:
                with open(args.out, "w") as f:
                    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
