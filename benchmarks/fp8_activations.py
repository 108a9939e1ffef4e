"""The FP8 down projection's input at Qwen3-14B's shape (17,408 columns): SiLU(gate) * up written out,
then quantized per token and 128 columns, against both in one pass
(`fp8_kernels.quantize_activations(silu_mul=True)`, which the served down projection uses). Both
layouts: the row GEMV's and Triton's (row-major scales), cuBLAS scaled_mm's (column-major scales,
rows padded to 16). Each pair is checked equal bit for bit, then timed replayed from a CUDA graph.

    python -m benchmarks.fp8_activations [--rows 1,4,16,64,256,1784,8192]
    python -m benchmarks.fp8_activations --sweep --rows 1784,8192

--sweep instead times the quantization kernel's launch shapes (groups of 128 columns a program,
warps) in the scaled_mm layout for both of a layer's inputs: the 5,120-column hidden rows (q/k/v,
o_proj and gate/up's input) and the down projection's SiLU * up, with the bytes it moves per second.
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4,16,64,256,1784,8192", help="token counts, comma-separated")
    parser.add_argument("--columns", type=int, default=17_408, help="intermediate size (gate, up each)")
    parser.add_argument("--hidden", type=int, default=5_120, help="hidden size (--sweep)")
    parser.add_argument("--sweep", action="store_true", help="time the kernel's launch shapes instead")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.fp8_activations needs a CUDA GPU")
    if args.sweep:
        sweep([int(r) for r in args.rows.split(",")], args.hidden, args.columns)
        return
    from triton.testing import do_bench_cudagraph

    from core.execution.model.fp8_kernels import quantize_activations
    from core.execution.model.fused import silu_mul

    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, SiLU * up over {args.columns} columns, then quantized (us):")
    for m in (int(r) for r in args.rows.split(",")):
        gate_up = (torch.randn(m, 2 * args.columns, device="cuda") * 3).to(torch.bfloat16)
        for column_major in (False, True):
            rows = -(-m // 16) * 16 if column_major else m
            apart = lambda: quantize_activations(silu_mul(gate_up), column_major, rows)  # noqa: B023, E731
            fused = lambda: quantize_activations(gate_up, column_major, rows, silu_mul=True)  # noqa: B023, E731
            (q0, s0), (q1, s1) = apart(), fused()
            equal = torch.equal(q0.float(), q1.float()) and torch.equal(s0, s1)
            apart_us, fused_us = (do_bench_cudagraph(fn, rep=50) * 1e3 for fn in (apart, fused))
            layout = "scaled_mm layout" if column_major else "row-major scales"
            print(f"  M={m:5d} {layout:16s}  SiLU*up then quantize {apart_us:7.1f}  one pass {fused_us:7.1f}"
                  f"  equal bit for bit: {equal}", flush=True)
            assert equal, f"M={m}: the one-pass quantization differs from SiLU * up then quantization"


def sweep(row_counts: list[int], hidden: int, columns: int) -> None:
    from triton.testing import do_bench_cudagraph

    from core.execution.model.fp8_kernels import quantize_activations

    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}: quantization launch shapes, scaled_mm layout (us, TB/s moved)")
    for m in row_counts:
        for silu, width in ((False, hidden), (True, columns)):
            x = (torch.randn(m, 2 * width if silu else width, device="cuda") * 3).to(torch.bfloat16)
            rows = -(-m // 16) * 16
            moved = x.numel() * 2 + rows * width + rows * -(-width // 128) * 4
            expected = quantize_activations(x, True, rows, silu_mul=silu)
            results = []
            for groups in (2, 4, 8, 16):
                for warps in (2, 4, 8):
                    def quantize(x=x, rows=rows, silu=silu, groups=groups, warps=warps):
                        return quantize_activations(x, True, rows, silu_mul=silu, groups_per_program=groups,
                                                    num_warps=warps)
                    q, scales = quantize()
                    assert torch.equal(q.float(), expected[0].float()) and torch.equal(scales, expected[1])
                    us = do_bench_cudagraph(quantize, rep=50) * 1e3
                    results.append((us, groups, warps))
            results.sort()
            default = next(us for us, g, w in results if (g, w) == (min(8, -(-width // 128)), 4))
            label = "SiLU*up" if silu else "hidden"
            print(f"  M={m:5d} {label:8s} {width:6d} columns: default (8 groups, 4 warps) {default:7.1f} us "
                  f"({moved / default / 1e6:.2f} TB/s); best: " + ", ".join(
                      f"{g} groups {w} warps {us:.1f} ({moved / us / 1e6:.2f})" for us, g, w in results[:4]),
                  flush=True)


if __name__ == "__main__":
    main()
