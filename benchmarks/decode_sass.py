"""The FP8 decode products' instructions per weight byte, from their machine code, on any machine
(no GPU needed).

    python -m benchmarks.decode_sass [--k 5120 --n 7168] [--arch 90]

Compiles the kernels for an sm_90 GPU with the installed triton (its bundled ptxas and cuobjdump)
and counts SASS instructions:
* the row GEMV (`fp8_row_gemv._row_gemv_kernel`), one token a program, for a grid of tiles (rows a
  program, columns a piece, warps, scales folded or not). It is straight-line code (K is unrolled),
  so the count is what every thread executes;
* the tensor-core GEMM (`fp8_kernels._block_fp8_matmul_kernel`) at 16 rows a tile, as decode runs
  it: the instructions of its main loop's body (the longest backward branch) per K step.
Divided by the weight bytes a thread reads, it says how close a kernel comes to the SMs' issue rate
at a given bandwidth: an H100 issues ~225 thread-instructions a nanosecond per SM (4 schedulers x 32
lanes x ~1.75 GHz), and reading 3.0 TB/s over 132 SMs is 22.7 bytes a nanosecond per SM, 4.8 TB/s
(an H200, the same SMs and clocks) 36.4.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import re
import subprocess
import tempfile

SASS_LINE = re.compile(r"\s+/\*([0-9a-f]{4})\*/\s+(.*?);")


def compile_sass(kernel, constants: dict, pointers: dict[str, str], aligned: set[str], arch: int,
                 num_warps: int, num_stages: int = 3) -> list[tuple[int, str]]:
    """(address, instruction) of `kernel` compiled for sm_<arch>, integer arguments as i32 and those in
    `aligned` known to be multiples of 16 (as a launch specializes them)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names
    signature = {name: "constexpr" if name in constants else pointers.get(name, "i32") for name in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names) if name in aligned}
    source = ASTSource(fn=kernel, signature=signature, attrs=attrs,
                       constexprs={(names.index(name),): value for name, value in constants.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([cuobjdump, "-sass", cubin.name], capture_output=True, text=True,
                              check=True).stdout
    code = [(int(m.group(1), 16), m.group(2).strip())
            for m in map(SASS_LINE.match, sass.splitlines()) if m]
    return [(address, ins) for address, ins in code if not ins.startswith("NOP")]


def row_gemv_sass(k: int, n: int, rows: int, chunk: int, warps: int, fold: bool, arch: int) -> list[str]:
    from core.execution.model.fp8_row_gemv import _row_gemv_kernel

    constants = dict(K=k, ROWS=rows, CHUNK=chunk, GROUP=128, EVEN=k % chunk == 0 and n % rows == 0,
                     TOKENS=1, FOLD=fold, PDL=True)
    pointers = {"xq_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32",
                "c_ptr": "*bf16"}
    aligned = set(pointers) | {"stride_xm", "stride_wn", "stride_cm"}
    return [ins for _, ins in compile_sass(_row_gemv_kernel, constants, pointers, aligned, arch, warps)]


def matmul_loop_sass(block_n: int, warps: int, stages: int, arch: int) -> list[str]:
    """The main loop's body of the tensor-core GEMM at 16 rows a tile: one K step of 128 columns."""
    from core.execution.model.fp8_kernels import FP8_MAX, MIN_AMAX, _block_fp8_matmul_kernel

    constants = dict(BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=128, GROUP_M=8, QUANTIZE_A=False, FP8_MAX_=FP8_MAX,
                     MIN_AMAX_=MIN_AMAX)
    pointers = {"a_ptr": "*fp8e4nv", "a_scale_ptr": "*fp32", "b_ptr": "*fp8e4nv", "b_scale_ptr": "*fp32",
                "c_ptr": "*bf16"}
    aligned = set(pointers) | {"stride_am", "stride_bn", "stride_cm", "stride_cs", "K"}
    code = compile_sass(_block_fp8_matmul_kernel, constants, pointers, aligned, arch, warps, stages)
    loops = [(target, address) for address, ins in code if "BRA" in ins
             for target in [int(t, 16) for t in re.findall(r"0x([0-9a-f]+)", ins)] if target < address]
    first, last = max(loops, key=lambda loop: loop[1] - loop[0])
    return [ins for address, ins in code if first <= address <= last]


def _summary(code: list[str], weight_bytes: float) -> str:
    ops = collections.Counter(line.split()[1] if line.startswith("@") else line.split()[0] for line in code)
    top = ", ".join(f"{op} {count}" for op, count in ops.most_common(5))
    return (f"{len(code):5d} instructions, {weight_bytes:5.0f} weight bytes, {len(code) / weight_bytes:4.1f} "
            f"a byte ({top})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=5120, help="columns of the weight (in_features)")
    parser.add_argument("--n", type=int, default=7168, help="rows of the weight (out_features)")
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for sm_90")
    args = parser.parse_args()
    print(f"row GEMV, K={args.k}, N={args.n}, sm_{args.arch}: SASS instructions a thread executes")
    for rows, chunk, warps, fold in itertools.product((2, 4, 8), (1024, 2048), (4, 8), (False, True)):
        code = row_gemv_sass(args.k, args.n, rows, chunk, warps, fold, args.arch)
        print(f"rows {rows} chunk {chunk:5d} warps {warps}{' fold' if fold else '     '}: "
              + _summary(code, rows * args.k / (warps * 32)))
    print(f"tensor-core GEMM, 16 rows a tile, sm_{args.arch}: a thread's instructions a K step of 128")
    for block_n, warps, stages in ((32, 4, 4), (64, 4, 4), (128, 4, 4), (128, 8, 4)):
        code = matmul_loop_sass(block_n, warps, stages, args.arch)
        print(f"block_n {block_n:3d} warps {warps} stages {stages}: "
              + _summary(code, block_n * 128 / (warps * 32)))


if __name__ == "__main__":
    main()
