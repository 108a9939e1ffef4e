"""What a kernel boundary costs a decode step, and what programmatic dependent launch buys back.

    python -m benchmarks.launch_overlap --out launch_overlap.json [--layers 40] [--bandwidth-tb-s 3.35]

An FP8 decode step of the 14B shape at one row is ~650 kernels in one CUDA graph, and every linear
product spends 8-13 us above its weight bytes' time (benchmarks/NOTES.md, 2026-12-06). Whether that
is the products' kernels or the boundary between kernels, this measures with no product at all: a
chain of kernels shaped like the step's layers, captured in a CUDA graph.

  weight reads   per layer four kernels, each streaming one FP8 product's weight of the 14B shape
                 (qkv 36.7 MB, o 26.2, gate/up 178.3, down 89.1), a 32 KB slice a program summed
                 to one value and added to the value the kernel before wrote (every kernel
                 depends on the one before through memory, as a layer's do); separate buffers per
                 layer, so every read comes from HBM;
  small kernels  the layer's eleven small ones between them (norms, quantizations, q/k norm + RoPE,
                 KV write, attention's two, SiLU): a 5,120-value row read and written by 40
                 programs of 128 values, after the kernel before.

Chains: `layer` (both, in the step's order), `weights` (the weight reads alone), `small` (the
small kernels alone). Variants of each:

  plain       launched as usual: a kernel starts when the one before has finished;
  pdl_wait    programmatic dependent launch with the wait at entry (a kernel whose every load
              depends on its input): each kernel lets the next launch once all its programs run
              (gdc_launch_dependents), and waits for the one before (gdc_wait) before any load;
  pdl_stream  the weight reads load their slice before waiting (a weight does not depend on the
              kernel before), the small kernels as pdl_wait.

Per chain and variant: microseconds a layer (median of replays), the weight bytes' rate, and the
bytes' time at `--bandwidth-tb-s`; the JSON has every figure. Needs a GPU of compute capability
9.0 or newer for the PDL variants (earlier ones run `plain` only).
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

try:  # grid dependency control: Triton 3.4 and newer
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - an older Triton: the plain variant only
    gdc_launch_dependents = gdc_wait = None

WEIGHT_MB = {"qkv": 36.70016, "o": 26.2144, "gate_up": 178.25792, "down": 89.12896}  # 14B, FP8
SLICE_WORDS = 8192  # int32 words a program reads: 32 KB
ROW, ROW_BLOCK = 5120, 128
SMALL_PER_LAYER = (2, 4, 2, 3)  # small kernels before qkv, o, gate/up, down: 11 a layer
VARIANTS = ("plain", "pdl_wait", "pdl_stream")


@triton.jit
def _weight_read_kernel(weight_ptr, previous_ptr, out_ptr, SLICE: tl.constexpr, PDL: tl.constexpr,
                        LOAD_BEFORE_WAIT: tl.constexpr):
    pid = tl.program_id(0)
    if PDL:
        if not LOAD_BEFORE_WAIT:
            gdc_wait()
        gdc_launch_dependents()
    words = tl.load(weight_ptr + pid.to(tl.int64) * SLICE + tl.arange(0, SLICE))
    total = tl.sum(words, axis=0)
    if PDL and LOAD_BEFORE_WAIT:
        gdc_wait()
    previous = tl.load(previous_ptr)
    tl.store(out_ptr + pid, previous + (total & 1).to(tl.float32) * 1e-30)


@triton.jit
def _row_kernel(in_ptr, out_ptr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(in_ptr + offs) * 0.5 + 1.0)


class Chain:
    """One graph's worth of kernels: `layers` layers of the chosen kinds, one variant."""

    def __init__(self, weights: list[dict[str, torch.Tensor]], kinds: str, variant: str) -> None:
        self.weights, self.kinds, self.variant = weights, kinds, variant
        self.rows = torch.zeros(2, ROW, device="cuda")
        largest = max(t.numel() for t in weights[0].values()) // SLICE_WORDS
        self.partials = torch.zeros(2, largest, device="cuda")
        self.flip = 0

    def _small(self) -> None:
        pdl = self.variant != "plain"
        src, dst = self.rows[self.flip], self.rows[1 - self.flip]
        _row_kernel[(ROW // ROW_BLOCK,)](src, dst, BLOCK=ROW_BLOCK, PDL=pdl, launch_pdl=pdl, num_warps=4)
        self.flip = 1 - self.flip

    def _weight(self, words: torch.Tensor) -> None:
        pdl = self.variant != "plain"
        programs = words.numel() // SLICE_WORDS
        previous = self.rows[self.flip] if self.kinds != "weights" else self.partials[self.flip]
        _weight_read_kernel[(programs,)](words, previous, self.partials[1 - self.flip], SLICE=SLICE_WORDS,
                                         PDL=pdl, LOAD_BEFORE_WAIT=self.variant == "pdl_stream",
                                         launch_pdl=pdl, num_warps=8)
        if self.kinds == "weights":  # the next weight read reads this one's values
            self.flip = 1 - self.flip

    def run(self) -> None:
        for layer in self.weights:
            for before, name in zip(SMALL_PER_LAYER, WEIGHT_MB):
                if self.kinds != "weights":
                    for _ in range(before):
                        self._small()
                if self.kinds != "small":
                    self._weight(layer[name])


def graph_ms(chain: Chain, replays: int) -> float:
    chain.run()  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain.run()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--replays", type=int, default=11)
    parser.add_argument("--bandwidth-tb-s", type=float, default=3.35,
                        help="the card's HBM bandwidth (H100 3.35, H200 4.8)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    pdl_ok = gdc_wait is not None and torch.cuda.get_device_capability() >= (9, 0)
    variants = VARIANTS if pdl_ok else ("plain",)
    weights = [{name: torch.empty(int(mb * 1e6) // 4, dtype=torch.int32, device="cuda")
                for name, mb in WEIGHT_MB.items()} for _ in range(args.layers)]
    layer_bytes = sum(WEIGHT_MB.values()) * 1e6
    floor_us = layer_bytes / (args.bandwidth_tb_s * 1e12) * 1e6
    results = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
               "torch": torch.__version__, "layers": args.layers, "bandwidth_tb_s": args.bandwidth_tb_s,
               "weight_floor_us_per_layer": floor_us, "pdl_available": pdl_ok, "chains": {}}
    print(f"{results['device']}  triton {triton.__version__}  weight bytes a layer "
          f"{layer_bytes / 1e6:.1f} MB, {floor_us:.1f} us at {args.bandwidth_tb_s} TB/s")
    for kinds in ("weights", "small", "layer"):
        for variant in variants:
            try:
                ms = graph_ms(Chain(weights, kinds, variant), args.replays)
            except Exception as exc:  # a variant this Triton or driver refuses is a figure that says why
                torch.cuda.synchronize()
                results["chains"][f"{kinds}/{variant}"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                print(f"{kinds:8s} {variant:10s} failed: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            per_layer = ms * 1e3 / args.layers
            row = {"us_per_layer": per_layer, "step_ms": ms}
            line = f"{kinds:8s} {variant:10s} {per_layer:8.1f} us a layer  {ms:7.3f} ms for {args.layers}"
            if kinds != "small":
                row["weight_tb_s"] = layer_bytes / (per_layer * 1e-6) / 1e12
                row["above_floor_us"] = per_layer - floor_us
                line += (f"  {row['weight_tb_s']:.2f} TB/s, "
                         f"{row['above_floor_us']:.1f} us above the bytes' time")
            if kinds == "small":
                row["us_per_kernel"] = per_layer / sum(SMALL_PER_LAYER)
                line += f"  {row['us_per_kernel']:.2f} us a kernel"
            results["chains"][f"{kinds}/{variant}"] = row
            print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
