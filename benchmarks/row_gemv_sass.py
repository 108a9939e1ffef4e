"""The row GEMV's instructions per weight byte, from its machine code, on any machine (no GPU).

    python -m benchmarks.row_gemv_sass [--k 5120 --n 7168] [--arch 90]

Compiles `fp8_row_gemv._row_gemv_kernel` for an sm_90 GPU with the installed triton (its bundled
ptxas and cuobjdump), one token a program, for a grid of tiles (rows a program, columns a piece,
warps, scales folded or not), and counts the SASS instructions of each: the kernel is straight-line
code (K is unrolled), so the count is what every thread executes. Divided by the weight bytes a
thread reads, it says how close a tile comes to the SMs' issue rate at a given bandwidth: an H100
issues ~225 thread-instructions a nanosecond per SM (4 schedulers x 32 lanes x ~1.75 GHz), and
reading 3.0 TB/s over 132 SMs is 22.7 bytes a nanosecond per SM, 4.8 TB/s (an H200) 36.4.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import re
import subprocess
import tempfile

SASS_LINE = re.compile(r"\s+/\*[0-9a-f]{4}\*/\s+(.*?);")


def sass_of(k: int, n: int, rows: int, chunk: int, warps: int, fold: bool, arch: int) -> list[str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from core.execution.model.fp8_row_gemv import _row_gemv_kernel

    constants = dict(K=k, ROWS=rows, CHUNK=chunk, GROUP=128, EVEN=k % chunk == 0 and n % rows == 0, TOKENS=1,
                     FOLD=fold, PDL=True)
    pointers = {"xq_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32",
                "c_ptr": "*bf16"}
    names = _row_gemv_kernel.arg_names
    signature = {name: "constexpr" if name in constants else pointers.get(name, "i32") for name in names}
    # As the launch specializes them: the pointers and the row strides are multiples of 16.
    aligned = set(pointers) | {"stride_xm", "stride_wn", "stride_cm"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names) if name in aligned}
    source = ASTSource(fn=_row_gemv_kernel, signature=signature, attrs=attrs,
                       constexprs={(names.index(name),): value for name, value in constants.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([cuobjdump, "-sass", cubin.name], capture_output=True, text=True,
                              check=True).stdout
    return [m.group(1).strip() for m in map(SASS_LINE.match, sass.splitlines())
            if m and not m.group(1).strip().startswith("NOP")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=5120, help="columns of the weight (in_features)")
    parser.add_argument("--n", type=int, default=7168, help="rows of the weight (out_features)")
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for sm_90")
    args = parser.parse_args()
    print(f"row GEMV, K={args.k}, N={args.n}, sm_{args.arch}: SASS instructions a thread executes")
    for rows, chunk, warps, fold in itertools.product((2, 4, 8), (1024, 2048), (4, 8), (False, True)):
        code = sass_of(args.k, args.n, rows, chunk, warps, fold, args.arch)
        weight_bytes = rows * args.k / (warps * 32)
        ops = collections.Counter(line.split()[1] if line.startswith("@") else line.split()[0]
                                  for line in code)
        top = ", ".join(f"{op} {count}" for op, count in ops.most_common(5))
        print(f"rows {rows} chunk {chunk:5d} warps {warps}{' fold' if fold else '     '}: {len(code):5d} "
              f"instructions, {weight_bytes:5.0f} weight bytes, {len(code) / weight_bytes:4.1f} a byte "
              f"({top})")


if __name__ == "__main__":
    main()
